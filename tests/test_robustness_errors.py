"""A run that cannot go on says why: a component that raises ends the run with its
name, the emulated time, the request and the original exception, and what was
measured until then is written with status "aborted"; a true deadlock says what waits
on what; emulated time too coarse for 1 us is refused (issue 18, items 1 and 4)."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

import devices.engines.decode as decode_mod
import rack.cli
import rack.serving.router as router_mod
from rack.cli.app import app
from rack.run.runner import RunAborted, run_scenario
from rack.runtime.errors import ComponentError
from rack.runtime.virtual import VirtualTimeDeadlock
from rack.wiring.load import load_scenario
from test_config_errors_scenarios import BASE  # small split rack: Llama-3.1-8B on H100s
from workloads import Request, load_requests
from workloads.clock import MAX_EMULATED_S, TimeSpanError, check_time_span

BAD_ID = 4


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(BASE)
    return path


@pytest.fixture
def decode_raises(monkeypatch):
    """The decode engine raises when request BAD_ID's KV arrives (a message the
    interconnect sent, handled by the decode core)."""
    real = decode_mod.DecodeEngine.receive_kv

    def receive_kv(self, now, req, *args, **kwargs):
        if req.id == BAD_ID:
            raise ValueError("injected: KV of an unexpected shape")
        return real(self, now, req, *args, **kwargs)

    monkeypatch.setattr(decode_mod.DecodeEngine, "receive_kv", receive_kv)


def _requests(n: int = 12) -> list[Request]:
    return [Request(id=i, arrival_s=0.05 * i, prompt_tokens=300 + 10 * i, output_tokens=20) for i in range(n)]


def test_a_failing_background_task_names_its_cause(small, decode_raises):
    with pytest.raises(RunAborted) as e:
        run_scenario(load_scenario(small), _requests())
    err = e.value.cause
    assert isinstance(err, ComponentError), repr(err)          # not a deadlock
    assert (err.component, err.request_id) == ("decode-0", BAD_ID)
    assert isinstance(err.cause, ValueError) and "unexpected shape" in str(err.cause)
    res, cols = e.value.output.results, e.value.output.columns
    row = list(cols["id"]).index(BAD_ID)
    # it raised when the request's KV reached the decode side: after its prefill, when
    # its transfer had started
    assert math.isfinite(err.t_s) and err.t_s >= cols["t_transfer_start"][row] >= cols["t_prefill_end"][row]
    assert str(e.value) == (f"component 'decode-0' raised at t={err.t_s:.6f} s (request {BAD_ID}): "
                            "ValueError: injected: KV of an unexpected shape")
    assert res["status"] == "aborted"
    assert res["error"]["component"] == "decode-0" and res["error"]["request_id"] == BAD_ID
    r = res["requests"]
    assert r["submitted"] == 12 and r["open"] >= 1
    assert r["completed"] + r["rejected"] + r["failed"] + r["open"] == 12
    # the core that raised: its state is whatever the error left, so no stats from it
    assert res["error"]["components_without_stats"] == ["decode-0"]


def test_an_exception_in_a_component_the_driver_awaits(small, monkeypatch):
    real = router_mod.Router._tick
    calls = []

    def tick(self, now, batch, base=0):
        calls.append(now)
        if len(calls) == 3:
            raise KeyError("no such tenant")
        return real(self, now, batch, base)

    monkeypatch.setattr(router_mod.Router, "_tick", tick)
    with pytest.raises(RunAborted) as e:
        run_scenario(load_scenario(small), _requests())
    err = e.value.cause
    assert isinstance(err, ComponentError) and err.component == "router"
    assert err.t_s == pytest.approx(0.10) and isinstance(err.cause, KeyError)
    r = e.value.output.results["requests"]
    assert r["open"] >= 10 and r["completed"] + r["open"] == 12   # 2 ticks had been dispatched


def test_a_true_deadlock_says_what_waits_on_what(small, monkeypatch):
    real = decode_mod.DecodeEngine.reserve_kv

    def reserve_kv(self, now, req, *args, **kwargs):
        if req.id == BAD_ID:
            return                                # a reservation nothing will ever grant
        return real(self, now, req, *args, **kwargs)

    monkeypatch.setattr(decode_mod.DecodeEngine, "reserve_kv", reserve_kv)
    with pytest.raises(RunAborted) as e:
        run_scenario(load_scenario(small), _requests())
    err = e.value.cause
    assert isinstance(err, VirtualTimeDeadlock)
    msg = str(err)
    assert f"1 request(s) never ended, e.g. {BAD_ID} (after prefill_end)" in msg, msg
    assert f"prefill-0: handoff of request {BAD_ID} waits for decode-0 (reserving)" in msg, msg
    res = e.value.output.results
    assert res["status"] == "aborted" and res["requests"]["completed"] == 11 and res["requests"]["open"] == 1


def test_rack_run_prints_one_line_and_keeps_what_was_measured(small, decode_raises, tmp_path):
    rack.cli._register_commands()
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", "--runtime", "virtual", "--scenario", str(small),
                                   "--max-requests", "12", "--out", str(out)])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    errors = [l for l in res.output.splitlines() if l.startswith("error: ")]
    assert len(errors) == 1, res.output
    assert errors[0].startswith(f"error: run aborted: component 'decode-0' raised at t=")
    assert f"(request {BAD_ID}): ValueError: injected: KV of an unexpected shape" in errors[0]
    assert f"{out}/results.json (status aborted)" in errors[0] and f"{out}/error.log" in errors[0]
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "aborted" and results["error"]["type"] == "ValueError"
    assert results["requests"]["submitted"] == 12
    log = (out / "error.log").read_text()
    assert "Traceback" in log and "receive_kv" in log and "injected: KV of an unexpected shape" in log
    assert (out / "summary.txt").read_text().startswith("RUN ABORTED: component 'decode-0' raised")
    assert (out / "requests.csv").read_text().count("\n") == 13


def test_a_complete_run_says_so(small):
    out = run_scenario(load_scenario(small), _requests(3))
    assert out.results["status"] == "complete" and "error" not in out.results
    assert 0 < out.results["emulation"]["time_resolution_s"] <= 1e-6


# ------------------------------------------------------------------ time precision

def test_time_span_limit():
    check_time_span(MAX_EMULATED_S * (1 - 2 ** -52))
    assert math.ulp(MAX_EMULATED_S * (1 - 2 ** -52)) <= 1e-6 < math.ulp(MAX_EMULATED_S)
    for t in (MAX_EMULATED_S, 1e12, 1e15, math.inf, math.nan):
        with pytest.raises(TimeSpanError, match="coarser than 1 us"):
            check_time_span(t)


def test_arrivals_too_late_for_microseconds_are_refused(small, tmp_path, monkeypatch):
    import rack.runtime.virtual_run as vr

    monkeypatch.setattr(vr, "run_topology_virtual", lambda *a: pytest.fail("a component was started"))
    reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=10, output_tokens=2),
            Request(id=1, arrival_s=1e15, prompt_tokens=10, output_tokens=2)]
    with pytest.raises(TimeSpanError, match=r"at 1e\+15 s of emulated time, where float64 seconds resolve only 0.125 s"):
        run_scenario(load_scenario(small), reqs)
    # a trace whose second row is 1e15 ms after its first: `rack run` refuses it in one line
    trace = tmp_path / "late.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
                     '{"timestamp": 1e15, "input_length": 10, "output_length": 2}\n')
    assert load_requests(trace)[-1].arrival_s == 1e12
    rack.cli._register_commands()
    res = CliRunner().invoke(app, ["run", "--runtime", "virtual", "--scenario", str(small), "--trace", str(trace),
                                   "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "error: the last arrival is at 1e+12 s of emulated time" in res.output


@pytest.mark.parametrize("runtime", ["virtual", pytest.param("ray", marks=pytest.mark.ray)])
def test_both_runtimes_name_the_component_that_raised(runtime, small, request):
    """No monkeypatching: a request built in code with a prefix hash that cannot be
    hashed makes the prefill instance's prefix cache raise inside its engine loop (a
    background task on virtual time, inside an actor on Ray)."""
    if runtime == "ray":
        request.getfixturevalue("ray_session")
    reqs = [Request(id=i, arrival_s=0.05 * i, prompt_tokens=600, output_tokens=5, block_size=512,
                    block_hashes=([1],) if i == 2 else (i,)) for i in range(6)]
    sc = load_scenario(small).with_overrides(dilation=5.0)
    with pytest.raises(RunAborted) as e:
        run_scenario(sc, reqs, runtime=runtime, timeout_s=120 if runtime == "ray" else None)
    err = e.value.cause
    assert isinstance(err, ComponentError), repr(err)
    assert (err.component, err.request_id, type(err.cause)) == ("prefill-0", 2, TypeError)
    assert err.t_s == pytest.approx(0.10, abs=0.05)            # request 2 arrives at 0.10 s
    assert "unhashable" in err.traceback_text() and "prefix_lookup" in err.traceback_text()
    res = e.value.output.results
    assert res["status"] == "aborted" and res["error"]["component"] == "prefill-0"
    r = res["requests"]
    assert r["submitted"] == 6 and r["open"] >= 1 and r["completed"] + r["open"] == 6
