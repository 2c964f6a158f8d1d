"""`rack.serve.openai_api.parse_request` without a server: what OpenAI's API (and vLLM's)
refuse is refused with a 400 naming the field; sampling parameters in range pass."""

from __future__ import annotations

import pytest

from rack.serve.openai_api import ApiError, parse_request

SERVED = dict(served=("kimi-k2",), max_model_len=131072, eos_mean_tokens=256, request_id=1)


def _completion(**extra):
    return {"model": "kimi-k2", "prompt": "hello", "max_tokens": 3, **extra}


@pytest.mark.parametrize("kind, body, param", [
    ("chat", {"model": "kimi-k2", "messages": [{"role": "wizard", "content": "x"}], "max_tokens": 3},
     "messages.0.role"),
    ("completion", _completion(temperature=-1), "temperature"),
    ("completion", _completion(temperature=2.5), "temperature"),
    ("completion", _completion(top_p=0), "top_p"),
    ("completion", _completion(presence_penalty=3), "presence_penalty"),
    ("completion", _completion(stream="yes"), "stream"),
    ("completion", _completion(ignore_eos="true"), "ignore_eos"),
    ("completion", _completion(prompt=[1, -2, 3]), "prompt.1"),
    ("completion", _completion(prompt=[[1, 2, -3]]), "prompt.0.2"),
    ("completion", _completion(prompt=None, prompt_token_ids=[5, -1]), "prompt_token_ids.1"),
    ("completion", _completion(stop=["a", "b", "c", "d", "e"]), "stop"),
    ("completion", _completion(stop=7), "stop"),
])
def test_refused_with_the_field_named(kind, body, param):
    with pytest.raises(ApiError) as err:
        parse_request(kind, body, **SERVED)
    assert err.value.status == 400 and err.value.param == param, err.value.message
    assert err.value.message.startswith(param.split(".")[0])


def test_sampling_parameters_in_range_change_nothing():
    plain = parse_request("completion", _completion(ignore_eos=True), **SERVED)
    tuned = parse_request("completion", _completion(ignore_eos=True, temperature=0.7, top_p=0.9, stop=["rack"],
                                                    frequency_penalty=-1.5, seed=3), **SERVED)
    assert (plain.prompt_tokens, plain.output_tokens, plain.finish_reason) == \
        (tuned.prompt_tokens, tuned.output_tokens, tuned.finish_reason) == (1, 3, "length")
    chat = parse_request("chat", {"model": "kimi-k2", "max_tokens": 2, "messages": [
        {"role": r, "content": "x"} for r in ("system", "developer", "user", "assistant", "tool")]}, **SERVED)
    assert chat.output_tokens <= 2
