"""Request: the fixed dataclass of docs/interfaces.md."""

import dataclasses
import pickle

import pytest

from workloads import Request, Turn


def test_fields_and_defaults_match_the_contract():
    names = [f.name for f in dataclasses.fields(Request)]
    assert names == ["id", "arrival_s", "prompt_tokens", "output_tokens", "block_hashes",
                     "block_size", "tenant", "slo_class", "reasoning_tokens", "turn"]
    r = Request(3, 1.5, 100, 20)
    assert (r.block_hashes, r.block_size, r.tenant, r.slo_class, r.reasoning_tokens, r.turn) == \
        (None, 512, None, None, 0, None)
    assert [f.name for f in dataclasses.fields(Turn)] == ["session", "index", "think_time_s"]


@pytest.mark.parametrize("args", [("", 0, 0.0), ("s", -1, 0.0), ("s", 1, -0.5), ("s", 1, float("nan"))])
def test_bad_turns_are_refused(args):
    with pytest.raises(ValueError, match="Turn"):
        Turn(*args)


def test_frozen_slots_and_picklable():
    r = Request(1, 0.25, 1000, 10, (1, 2), 512, "t", "gold")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.prompt_tokens = 5
    assert not hasattr(r, "__dict__")
    assert pickle.loads(pickle.dumps(r)) == r
    assert hash(r) == hash(Request(1, 0.25, 1000, 10, (1, 2), 512, "t", "gold"))


@pytest.mark.parametrize("kwargs", [dict(prompt_tokens=0), dict(output_tokens=0),
                                    dict(output_tokens=-3), dict(block_size=0)])
def test_rejects_non_positive_lengths(kwargs):
    args = dict(id=7, arrival_s=0.0, prompt_tokens=10, output_tokens=10) | kwargs
    with pytest.raises(ValueError, match="Request 7: prompt_tokens"):
        Request(**args)


def test_reasoning_tokens_lie_within_the_output():
    assert Request(1, 0.0, 10, 20, reasoning_tokens=20).reasoning_tokens == 20
    for bad in (21, -1):
        with pytest.raises(ValueError, match="reasoning_tokens"):
            Request(1, 0.0, 10, 20, reasoning_tokens=bad)


def test_import_is_light_and_imports_nothing_of_the_project():
    import subprocess
    import sys
    code = ("import sys, workloads; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('numpy', 'rack', 'devices', 'interconnect', 'ray')); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
