"""The endpoint never answers 500 for a client's input (issue 24): the real app and
uvicorn (with `rack.serve.limits`) over a rack that answers at once
(`tests/_serve_fakes.py`, no Ray). Out-of-range or ill-typed numbers, deep nesting
and oversized bodies are 4xx naming the problem, on a connection that stays usable;
a handler that raises is logged, answered 500 in OpenAI's JSON without dropping the
connection, and counted; slow clients are cut off by the header and read timeouts;
an empty API key is refused at start-up; /rack/* needs the key. A hypothesis fuzz of
both endpoints finds no 500. Every call has a timeout; the server binds 127.0.0.1."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rack.serve.limits import HttpLimits, RequestRefused, parse_json
from workloads.jsontext import json_depth
from _serve_fakes import KEY, serve_in_thread  # tests/ helpers

AUTH = {"Authorization": f"Bearer {KEY}"}
LIMITS = HttpLimits(max_body_bytes=1 << 20, header_timeout_s=0.5, read_timeout_s=0.5)


@pytest.fixture(scope="module")
def server():
    with serve_in_thread(LIMITS, fail_on=13) as state:
        with httpx.Client(timeout=30) as client:      # one client: making one costs ~30 ms
            state["client"] = client
            yield state


def _post(client, url, body, path="/v1/completions"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(url + path, content=data, headers={**AUTH, "content-type": "application/json"})


def _raw(url: str, data: bytes, timeout: float = 10.0) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    if data:
        sock.sendall(data)
    return sock


def _request(body: bytes, path: str = "/v1/completions") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {KEY}\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


def _read_response(sock: socket.socket) -> tuple[int, dict, bytes]:
    """One HTTP/1.1 response with a Content-Length body."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {buf!r}")
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    n = int(headers.get("content-length", 0))
    while len(body) < n:
        body += sock.recv(65536)
    return int(lines[0].split()[1]), headers, body


VALID = {"model": "kimi-k2", "prompt": [1, 2], "max_tokens": 2, "ignore_eos": True}

# The issue's inputs, each a 4xx naming the field or the problem.
ISSUE_INPUTS = [
    ({"model": "kimi-k2", "prompt": [9223372036854775808], "max_tokens": 2}, 400, "prompt.0"),
    ({"model": "kimi-k2", "prompt": [2**64 + 5], "max_tokens": 2}, 400, "prompt.0"),
    ({"model": "kimi-k2", "prompt": [163_840], "max_tokens": 2}, 400, "prompt"),       # beyond the vocabulary
    ({"model": "kimi-k2", "prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    ({"model": "kimi-k2", "prompt": "x", "max_tokens": True}, 400, "max_tokens"),
    ({"model": "kimi-k2", "prompt": [True, False], "max_tokens": 2}, 400, "prompt.0"),
    ({"model": "kimi-k2", "prompt": "x", "max_tokens": 2, "seed": -5}, 400, "seed"),
    ({"model": "kimi-k2", "prompt": "x", "max_tokens": 10**30}, 400, "max_tokens"),
    ({"model": "kimi-k2", "prompt": "x", "max_tokens": 2, "min_tokens": 10**18}, 400, "min_tokens"),
    ({"model": "kimi-k2", "prompt": "x", "max_tokens": 2, "stream": True,
      "stream_options": {"include_usage": "yes"}}, 400, "stream_options.include_usage"),
    ({"model": "kimi-k2", "prompt": [1], "max_tokens": 2, "rack_block_hashes": [2**70]}, 400, "rack_block_hashes.0"),
    ({"model": "kimi-k2", "prompt": [1], "max_tokens": 2, "rack_block_size": 10**12}, 400, "rack_block_size"),
    ({"model": "kimi-k2", "prompt": "x", "max_tokens": 2, "n": 10**40}, 400, "n"),
    ({"model": ["kimi-k2"], "prompt": "x", "max_tokens": 2}, 400, "model"),
    ({"model": "kimi-k2", "messages": [{"role": ["user"], "content": "x"}], "max_tokens": 2}, 400, "messages.0.role"),
    # fields that change no timing are still typed as OpenAI's API types them (issue 37)
    ({**VALID, "user": 5}, 400, "user"),
    ({**VALID, "suffix": ["x"]}, 400, "suffix"),
    ({**VALID, "logit_bias": [1, 2]}, 400, "logit_bias"),
    ({**VALID, "logit_bias": {"50256": 1000}}, 400, "logit_bias.50256"),
    ({**VALID, "response_format": "json"}, 400, "response_format"),
    ({"model": "kimi-k2", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "tools": {"a": 1}},
     400, "tools"),
]


@pytest.mark.parametrize("body, status, param", ISSUE_INPUTS)
def test_bad_numbers_and_types_are_400_naming_the_field(server, body, status, param):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    with httpx.Client(timeout=10) as c:
        r = _post(c, server["url"], body, path)
        assert r.status_code == status, r.text
        assert r.json()["error"]["param"] == param, r.text
        assert "9223372036854775808" not in r.text.replace(str(body), "")
        ok = _post(c, server["url"], VALID)          # the same keep-alive connection still serves
        assert ok.status_code == 200, ok.text


def test_deep_nesting_and_bad_json_are_400_not_500(server):
    with httpx.Client(timeout=10) as c:
        for body, words in ((b"[" * 100_000 + b"]" * 100_000, "nests 100000 levels"),
                            (b'{"model": "kimi-k2", "prompt": ' + b"[" * 65 + b"]" * 65 + b"}", "nests 66 levels"),
                            (b'{"model": "kimi-k2", "prompt": [1, 2', "not valid JSON"),
                            (b"\xff\xfe garbage", "not UTF-8 (byte 0xff at offset 0)"),
                            # UTF-16 (json.loads would have guessed it) is refused: JSON is UTF-8
                            (json.dumps(VALID).encode("utf-16"), "not UTF-8"),
                            (b"[1, 2]", "must be a JSON object")):
            r = _post(c, server["url"], body)
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        assert _post(c, server["url"], VALID).status_code == 200


@pytest.mark.parametrize("path, body, words", [
    ("/tokenize", b"[" * 100_000 + b"]" * 100_000, "nests 100000 levels"),
    ("/detokenize", json.dumps({"tokens": [2**70]}).encode(), "less than or equal to 2147483647"),
    ("/detokenize", json.dumps({"tokens": [10**6]}).encode(), "out of the tokenizer's vocabulary"),
    ("/detokenize", json.dumps({"tokens": [True]}).encode(), "valid integer"),
])
def test_vllm_utility_routes_refuse_bad_bodies_with_400(server, path, body, words):
    r = server["client"].post(server["url"] + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_json_depth_counts_brackets_outside_strings_only():
    assert json_depth(b'{"a": "[[[[\\"[[", "b": [[1], {"c": []}]}') == 4
    assert json_depth(b"7") == 0
    with pytest.raises(RequestRefused, match="nests 3 levels deep"):
        parse_json(b"[[[1]]]", max_depth=2)


def test_a_prompt_beyond_the_context_is_refused_before_it_is_validated_or_counted():
    """A million ids or megabytes of text took 1-8 s of the front's loop to validate or
    count before the context check refused them (no stream was paced meanwhile)."""
    from rack.serve.openai_api import ApiError, parse_request

    kw = dict(served=("kimi-k2",), max_model_len=4096, eos_mean_tokens=8, request_id=1)
    for kind, body, param, words in (
            ("completion", {"model": "kimi-k2", "prompt": [1] * 5000, "max_tokens": 2}, "prompt", "5,000 token ids"),
            ("completion", {"model": "kimi-k2", "prompt_token_ids": ["x"] * 5000}, "prompt_token_ids", "5,000 token"),
            ("completion", {"model": "kimi-k2", "prompt": ["abcdef " * 6000]}, "prompt", "at least 6,000 tokens"),
            ("chat", {"model": "kimi-k2", "messages": [{"role": "user", "content": [{"type": "text", "text": "ab" * 13000}]}]},
             "messages", "at least 4,334 tokens")):
        with pytest.raises(ApiError) as e:
            parse_request(kind, body, **kw)
        assert e.value.status == 400 and e.value.param == param and words in e.value.message, e.value.message
    assert parse_request("completion", {"model": "kimi-k2", "prompt": " " * 30000 + "x", "max_tokens": 2},
                         **kw).prompt_tokens == 2          # blanks are not refused by their length alone


def test_an_oversized_body_is_413_declared_or_chunked(server):
    limit = LIMITS.max_body_bytes
    big = {**VALID, "junk": "a" * (limit + 10)}
    with httpx.Client(timeout=10) as c:
        r = _post(c, server["url"], big)
        assert r.status_code == 413 and f"at most {limit:,}" in r.json()["error"]["message"]

        def chunks():
            data = json.dumps(big).encode()
            for i in range(0, len(data), 65536):
                yield data[i:i + 65536]

        r = c.post(server["url"] + "/v1/completions", content=chunks(), headers=AUTH)   # no Content-Length
        assert r.status_code == 413, r.text
    with httpx.Client(timeout=10) as c:
        assert _post(c, server["url"], {**VALID, "junk": "a" * (limit // 2)}).status_code == 200


def test_a_handler_error_is_logged_answered_500_on_a_live_connection_and_counted(server, caplog):
    sock = _raw(server["url"], b"")
    try:
        with caplog.at_level("ERROR", logger="rack.serve"):
            sock.sendall(_request(json.dumps({**VALID, "prompt": list(range(1, 14))}).encode()))
            status, headers, body = _read_response(sock)
        assert status == 500 and headers.get("connection") != "close"
        assert json.loads(body)["error"]["type"] == "server_error"
        assert any("injected handler failure" in r.getMessage() and r.exc_info for r in caplog.records)
        sock.sendall(_request(json.dumps(VALID).encode()))          # the same connection
        status, _, body = _read_response(sock)
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2
    finally:
        sock.close()
    m = server["front"].metrics
    assert m.handler_errors[("/v1/completions",)] >= 1 and m.http[("/v1/completions", "500")] >= 1


def test_a_stream_that_breaks_after_its_200_ends_with_an_error_event(server, monkeypatch):
    front = server["front"]
    real = front.stream

    async def broken(rid):
        async for part in real(rid):
            yield part
            raise RuntimeError("broken mid-stream")

    monkeypatch.setattr(front, "stream", broken)
    with httpx.Client(timeout=10) as c:
        with c.stream("POST", server["url"] + "/v1/completions", headers=AUTH,
                      json={**VALID, "max_tokens": 5, "stream": True}) as r:
            lines = [ln for ln in r.iter_lines() if ln]
        assert r.status_code == 200
        assert json.loads(lines[-2].removeprefix("data: "))["error"]["code"] == 500 and lines[-1] == "data: [DONE]"
        monkeypatch.setattr(front, "stream", real)
        assert _post(c, server["url"], VALID).status_code == 200


def test_rack_routes_need_the_key(server):
    with httpx.Client(timeout=10) as c:
        rid = _post(c, server["url"], VALID).json()["id"].rsplit("-", 1)[1]
        assert c.get(f"{server['url']}/rack/requests/{rid}").status_code == 401
        assert c.get(f"{server['url']}/rack/requests/{rid}", headers={"Authorization": "Bearer nope"}).status_code == 401
        for _ in range(100):
            r = c.get(f"{server['url']}/rack/requests/{rid}", headers=AUTH)
            if r.status_code == 200:
                break
            time.sleep(0.02)
        assert r.status_code == 200 and r.json()["outcome"] == "completed"
        assert c.get(server["url"] + "/health").status_code == 200          # probes stay open


def _closed_within(sock: socket.socket, seconds: float) -> bytes:
    sock.settimeout(seconds)
    got = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return got
        got += chunk


def test_half_open_connections_are_closed_by_the_header_timeout(server):
    t0 = time.monotonic()
    socks = [_raw(server["url"], b"") for _ in range(50)] + \
        [_raw(server["url"], b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")]       # a head never finished
    try:
        answers = [_closed_within(s, 10.0) for s in socks]
    finally:
        for s in socks:
            s.close()
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[:2]
    assert time.monotonic() - t0 < 5.0          # 0.5 s each, all at once


def test_a_body_that_stalls_is_cut_by_the_read_timeout(server):
    sock = _raw(server["url"], _request(b'{"model": "kimi-k2"' + b" " * 50)[:-10])    # 10 bytes short
    try:
        t0 = time.monotonic()
        # the body stalled before the handler could answer: 408, as the docstring says
        assert _closed_within(sock, 10.0).startswith(b"HTTP/1.1 408")
        assert time.monotonic() - t0 < 5.0
    finally:
        sock.close()
    with httpx.Client(timeout=10) as c:                   # the server is fine
        assert _post(c, server["url"], VALID).status_code == 200


def test_a_keep_alive_connection_between_requests_is_not_cut_early(server):
    sock = _raw(server["url"], b"")
    try:
        for _ in range(2):
            sock.sendall(_request(json.dumps(VALID).encode()))
            assert _read_response(sock)[0] == 200
            time.sleep(0.8)          # past the header timeout, within uvicorn's 5 s keep-alive
    finally:
        sock.close()


def test_an_empty_api_key_is_refused_at_start_up(monkeypatch):
    from typer.testing import CliRunner

    from rack.cli import _register_commands
    from rack.cli.app import app
    from rack.serve.session import check_api_key

    for bad in ("", "   ", " key", "kéy"):
        with pytest.raises(ValueError, match="RACK_API_KEY"):
            check_api_key(bad)
    check_api_key(None)
    check_api_key("sk-proper")
    def must_not_start(*a, **k):
        raise AssertionError("rack serve started a server with an empty key")

    monkeypatch.setattr("rack.serve.session.LiveServer", must_not_start)
    _register_commands()
    res = CliRunner().invoke(app, ["serve"], env={"RACK_API_KEY": ""})
    assert res.exit_code == 2 and "RACK_API_KEY: empty" in res.output and "Traceback" not in res.output


# ---------------------------------------------------------------------------- fuzz
_json = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=12)
_FIELDS = ("model", "prompt", "prompt_token_ids", "messages", "max_tokens", "max_completion_tokens", "min_tokens",
           "stream", "stream_options", "ignore_eos", "temperature", "top_p", "presence_penalty", "stop", "n",
           "best_of", "seed", "echo", "logprobs", "rack_block_hashes", "rack_block_size", "tokens",
           "return_token_strs")
_value = st.one_of(_json, st.just("kimi-k2"), st.lists(st.integers(-5, 2**64), max_size=6),
                   st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "tool", "x", 3]),
                                                   "content": _json}), max_size=3),
                   st.integers(-3, 50), st.floats(-3, 3), st.booleans(), st.just({"include_usage": True}),
                   st.lists(st.text(max_size=5), max_size=5))


@st.composite
def _body(draw, chat: bool):
    """A valid request with up to three fields replaced by anything, a field or two
    dropped, or (one time in eight) any JSON value at all."""
    if draw(st.integers(0, 7)) == 0:
        return draw(_json)
    body = {"model": "kimi-k2", "max_tokens": draw(st.integers(1, 8)), "stream": draw(st.booleans()),
            **({"messages": [{"role": "user", "content": draw(st.text(max_size=30))}]} if chat else
               {"prompt": draw(st.one_of(st.text(max_size=30), st.lists(st.integers(0, 1000), min_size=1,
                                                                        max_size=20)))})}
    for key in draw(st.sets(st.sampled_from(sorted(body)), max_size=2)):
        del body[key]
    body.update(draw(st.dictionaries(st.sampled_from(_FIELDS), _value, max_size=3)))
    return body


@pytest.mark.timeout(300)
@settings(max_examples=250, deadline=5000, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data(), path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/tokenize",
                                             "/detokenize"]))
def test_fuzzed_requests_never_get_a_500(server, data, path):
    """The completion endpoints and vLLM's /tokenize and /detokenize, 250 bodies (a
    fixed seed: the same bodies every run), streamed or not; every answer is a 200 with
    a whole response or a 4xx with OpenAI's error JSON, and the server still answers a
    valid request after each."""
    payload = json.dumps(data.draw(_body("chat" in path or (path == "/tokenize" and data.draw(st.booleans())))),
                         allow_nan=True).encode()
    c = server["client"]
    with c.stream("POST", server["url"] + path, content=payload,
                  headers={**AUTH, "content-type": "application/json"}) as r:
        text = b"".join(r.iter_bytes())
    assert r.status_code in (200, 400, 404), (r.status_code, text[:300], payload[:300])
    if r.status_code != 200:
        assert json.loads(text)["error"]["message"]
    elif text.startswith(b"data:"):
        assert b'"code":500' not in text and text.rstrip().endswith(b"data: [DONE]"), text[-300:]
    assert _post(c, server["url"], VALID).status_code == 200       # and the server is still fine


def test_a_port_in_use_is_refused_before_ray_starts(tmp_path, monkeypatch):
    """`rack serve` on a port another process holds says so at once, in one line, and
    never starts Ray (the front would fail to bind only after Ray's start-up)."""
    import socket

    from typer.testing import CliRunner

    import rack.cli
    import rack.serve.session as session
    from rack.cli.app import app

    def never(*a, **k):  # pragma: no cover - reaching it is the failure
        raise AssertionError("the server was built although its port is taken")

    monkeypatch.setattr(session, "LiveServer", never)
    rack.cli._register_commands()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        res = CliRunner().invoke(app, ["serve", "--port", str(port), "--out", str(tmp_path / "out")])
    assert res.exit_code == 1
    assert f"--port {port}: cannot bind" in res.output and "in use" in res.output, res.output


def test_a_host_that_does_not_resolve_is_said_before_ray_starts_even_on_port_0(tmp_path, monkeypatch):
    """--port 0 skipped the check: a bad --host started Ray, then failed with the
    actor's remote traceback in its message."""
    from typer.testing import CliRunner

    import rack.cli
    import rack.serve.session as session
    from rack.cli.app import app

    def never(*a, **k):  # pragma: no cover - reaching it is the failure
        raise AssertionError("the server was built although its host cannot be bound")

    monkeypatch.setattr(session, "LiveServer", never)
    rack.cli._register_commands()
    res = CliRunner().invoke(app, ["serve", "--host", "999.1.1.1", "--port", "0", "--out", str(tmp_path / "out")])
    assert res.exit_code == 1 and "--host 999.1.1.1 --port 0: cannot bind" in res.output, res.output
