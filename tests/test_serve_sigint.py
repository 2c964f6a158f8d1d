"""`rack serve` as a user runs it: a process on the shared Ray cluster (--address),
stopped with SIGINT while streams are in flight: every in-flight request is ended
(its stream closes with an error event) and recorded in results.json, and the process
exits by itself. Binds 127.0.0.1; every wait has a timeout."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.ray


def _serve(ray_session, out, drain_s: float) -> tuple[subprocess.Popen, str | None]:
    """`rack serve` on the shared cluster, and its URL once it serves (None if it did not start)."""
    address = ray_session.get_runtime_context().gcs_address
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rack", "serve", "--address", address, "--host", "127.0.0.1", "--port", "0",
         "--dilation", "20", "--drain", str(drain_s), "--out", str(out)],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    url = None
    deadline = time.time() + 180
    while time.time() < deadline and url is None:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        m = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", line)
        url = m.group(1) if m else None
    return proc, url


def test_sigint_ends_and_records_every_in_flight_request(ray_session, tmp_path):
    out = tmp_path / "serve"
    proc, url = _serve(ray_session, out, 1)
    try:
        assert url, f"server did not start: {proc.stderr.read() if proc.poll() is not None else ''}"
        ends: list = [None, None]
        started = threading.Barrier(3, timeout=60)

        def stream(i):
            body = {"model": "kimi-k2", "prompt": list(range(1, 201)), "max_tokens": 3000, "ignore_eos": True,
                    "stream": True}
            lines = []
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                it = r.iter_lines()
                for line in it:
                    if line.startswith("data: {"):
                        break
                started.wait()
                lines = [ln for ln in it if ln]
            ends[i] = lines[-2:]

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        started.wait()                       # both streams have their first token
        proc.send_signal(signal.SIGINT)
        for t in threads:
            t.join(timeout=60)
        assert all(e is not None for e in ends), "a stream was left hanging"
        for e in ends:
            assert e[-1] == "data: [DONE]" and "server_shutdown" in e[0]
        stdout, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, stdout
    finally:
        if proc.poll() is None:
            proc.kill()
    results = json.loads((out / "results.json").read_text())
    req = results["requests"]
    assert req["submitted"] == 2 and req["open"] == 0
    assert req["failed_by_reason"] == {"server_shutdown": 2}
    assert (out / "front.csv").read_text().count("\n") == 3


def test_sigterm_twice_ends_the_drain_at_once_and_still_writes_everything(ray_session, tmp_path):
    # Issue 37: the serve loop put Ray's SIGTERM handler back when the drain began, so
    # a second SIGTERM exited 1 at once, wrote nothing and cut the streams. Now the
    # second ends the requests in flight at once: a stream with an error event and
    # `[DONE]`, a non-streamed request 503 (the server went away, not a failure).
    out = tmp_path / "serve"
    proc, url = _serve(ray_session, out, 600)
    try:
        assert url, f"server did not start: {proc.stderr.read() if proc.poll() is not None else ''}"
        got: dict = {}
        started = threading.Barrier(2, timeout=60)
        body = {"model": "kimi-k2", "prompt": list(range(1, 201)), "max_tokens": 3000, "ignore_eos": True}

        def stream():
            with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
                it = r.iter_lines()
                for line in it:
                    if line.startswith("data: {"):
                        break
                started.wait()
                got["stream"] = [ln for ln in it if ln][-2:]

        def plain():
            got["plain"] = httpx.post(url + "/v1/completions", json=body, timeout=120)

        threads = [threading.Thread(target=stream), threading.Thread(target=plain)]
        for t in threads:
            t.start()
        started.wait()                       # the stream has its first token
        proc.send_signal(signal.SIGTERM)     # drain: up to 600 s for the requests in flight
        time.sleep(2.0)
        assert proc.poll() is None           # still draining
        proc.send_signal(signal.SIGTERM)     # now
        for t in threads:
            t.join(timeout=90)
        assert got.get("stream") and got["stream"][-1] == "data: [DONE]" and "server_shutdown" in got["stream"][0]
        assert got["plain"].status_code == 503 and got["plain"].json()["error"]["code"] == "server_shutdown"
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, (stdout, stderr)
        assert "Traceback" not in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
    results = json.loads((out / "results.json").read_text())
    assert results["requests"]["submitted"] == 2 and results["requests"]["failed_by_reason"] == {"server_shutdown": 2}
