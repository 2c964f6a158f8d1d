"""Load controls (vLLM names), the random dataset, arrival windows, token distributions
and the closed-loop description."""

import math

import numpy as np
import pytest

from workloads import (ClosedLoop, GammaArrivals, LoadControls, LoadPlan, PmfTokens,
                       PoissonArrivals, Request, WeibullArrivals, apply_load, load_requests,
                       random_dataset, random_dataset_lengths, retime, window_times)
from workloads.arrivals import weibull_cv, weibull_shape


def test_request_rate_4_for_600_s_realises_4_per_s():
    """The issue's check: --request-rate 4 --duration 600 on the seeded stream."""
    for seed in (0, 1, 2):
        reqs = LoadPlan("random", controls=LoadControls(request_rate=4, duration_s=600,
                                                        seed=seed)).requests()
        assert max(r.arrival_s for r in reqs) < 600
        assert len(reqs) / 600 == pytest.approx(4.0, rel=0.05)
        # Poisson: the count's sd is sqrt(2400) = 49 (2%); the CV of the gaps is 1
        gaps = np.diff([r.arrival_s for r in reqs])
        assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)


def test_burstiness_is_vllms_gamma_shape():
    c = LoadControls(request_rate=10, burstiness=0.25, num_prompts=20_000, seed=3)
    assert c.arrival_process() == GammaArrivals(10, 2.0)      # CV = 1/sqrt(0.25)
    t = [r.arrival_s for r in random_dataset(c)]
    gaps = np.diff(t)
    assert 1 / gaps.mean() == pytest.approx(10, rel=4 * 2 / math.sqrt(20_000))
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.05)
    assert LoadControls(request_rate=2, burstiness=math.inf).arrival_process().gaps(
        3, np.random.default_rng()).tolist() == [0.5, 0.5, 0.5]
    assert LoadControls(request_rate=math.inf).arrival_process() is None


def test_retiming_a_trace_keeps_order_lengths_and_hashes():
    trace = load_requests("mooncake-excerpt")
    c = LoadControls(request_rate=2.0, num_prompts=100, seed=5)
    out = apply_load(trace, c)
    assert len(out) == 100
    for a, b in zip(trace, out):
        assert (a.id, a.prompt_tokens, a.output_tokens, a.block_hashes) == \
            (b.id, b.prompt_tokens, b.output_tokens, b.block_hashes)
    assert out[0].arrival_s == 0.0 and all(np.diff([r.arrival_s for r in out]) >= 0)
    assert out == apply_load(trace, c)                        # seeded
    assert [r.arrival_s for r in apply_load(trace, LoadControls(request_rate=math.inf))] == [0.0] * len(trace)
    cut = apply_load(trace, LoadControls(duration_s=30))      # the trace's own timing, first 30 s
    assert cut == [r for r in trace if r.arrival_s < 30]
    with pytest.raises(ValueError, match="needs a request rate"):
        retime(trace, LoadControls())


@pytest.mark.parametrize("kwargs,match", [
    (dict(request_rate=0), "request rate must be"), (dict(request_rate=float("nan")), "request rate"),
    (dict(burstiness=0.5), "give a request rate"), (dict(request_rate=1, burstiness=0), "burstiness"),
    (dict(num_prompts=0), "num-prompts"), (dict(max_concurrency=2.5), "max-concurrency"),
    (dict(duration_s=-1), "duration"), (dict(think_time_s=1.0), "give max concurrency"),
])
def test_load_controls_reject_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoadControls(**kwargs)


def test_random_dataset_lengths_follow_vllm():
    u = random_dataset_lengths(1024, 256, 0.5)
    assert (u.prompt_min, u.prompt_max, u.output_min, u.output_max) == (512, 1536, 128, 384)
    assert random_dataset_lengths(10, 1, 0.9).output_min == 1   # never 0 output tokens
    with pytest.raises(ValueError, match=r"range_ratio must be in \[0, 1\)"):
        random_dataset_lengths(10, 10, 1.0)
    reqs = random_dataset(LoadControls(num_prompts=5000, seed=1), input_len=1000, output_len=100,
                          range_ratio=0.2)
    p = np.array([r.prompt_tokens for r in reqs])
    assert p.min() >= 800 and p.max() <= 1200 and p.mean() == pytest.approx(1000, rel=0.01)
    assert all(r.arrival_s == 0.0 for r in reqs)              # vLLM's default rate: inf
    assert len(random_dataset(LoadControls())) == 1000        # vLLM's default --num-prompts
    with pytest.raises(ValueError, match="finite request rate"):
        random_dataset(LoadControls(duration_s=10))


def test_random_dataset_shared_prefix_has_shared_hashes():
    reqs = random_dataset(LoadControls(num_prompts=20), input_len=100, output_len=10,
                          prefix_len=1100, block_size=512)
    assert all(r.prompt_tokens == 1200 and len(r.block_hashes) == 3 for r in reqs)
    assert len({r.block_hashes[:2] for r in reqs}) == 1       # the two full prefix blocks
    assert len({r.block_hashes[2] for r in reqs}) == 20       # the rest is each prompt's own


def test_window_times_exact_and_stationary():
    for p in (PoissonArrivals(0.5), GammaArrivals(0.5, 4.0), WeibullArrivals(0.5, shape=0.4)):
        t = window_times(p, 600, 1200, seed=2)
        assert t.size == 300 and t.min() >= 600 and t.max() < 1200
        # stationary renewal process: mean count = rate x length (sd of the mean over 400
        # seeds: sqrt(300 cv^2 / 400), cv <= 4 -> 3.5 requests)
        cv = getattr(p, "cv", 1.0)
        counts = [window_times(p, 0, 600, exact=False, seed=s).size for s in range(400)]
        assert np.mean(counts) == pytest.approx(300, abs=4 * math.sqrt(300 * cv ** 2 / 400))
    assert window_times(PoissonArrivals(1e-4), 0, 600, seed=0).size == 0


def test_weibull_shape_and_cv():
    assert weibull_cv(1.0) == pytest.approx(1.0)
    assert weibull_shape(weibull_cv(0.375)) == pytest.approx(0.375, rel=1e-6)
    g = WeibullArrivals(2.0, cv=3.0).gaps(200_000, np.random.default_rng(0))
    assert 1 / g.mean() == pytest.approx(2.0, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(3.0, rel=0.1)
    assert WeibullArrivals(2.0, cv=3.0).with_rate(5.0).shape == WeibullArrivals(2.0, cv=3.0).shape
    with pytest.raises(ValueError, match="exactly one of shape or cv"):
        WeibullArrivals(1.0)


def test_pmf_tokens():
    pmf = PmfTokens.from_mapping({"100": 0.25, "300": 0.75})
    assert pmf.mean == 250
    x = pmf.draw(40_000, np.random.default_rng(0))
    assert set(x.tolist()) == {100, 300} and x.mean() == pytest.approx(250, rel=0.01)
    for bad, match in (({"1": 0.5}, "sum to 1"), ({"0": 1.0}, r"in \[1, 100,000,000\]"), ({"a": 1.0}, "not an integer")):
        with pytest.raises(ValueError, match=match):
            PmfTokens.from_mapping(bad)


def test_closed_loop_waits_for_a_slot_or_the_request_own_arrival():
    reqs = [Request(i, t, 10, 5) for i, t in enumerate([0.0, 0.0, 0.5, 10.0])]
    src = ClosedLoop(tuple(reqs), 2, think_time_s=1.0, think_time="fixed").source()
    assert [r.arrival_s for r in src.start()] == [0.0, 0.0]
    assert src.on_complete(2.0).arrival_s == 3.0              # slot frees at 2 + think 1
    assert src.on_complete(2.5).arrival_s == 10.0             # its own arrival is later
    assert src.on_complete(11.0) is None and src.outstanding == 1
    with pytest.raises(ValueError, match="arrival order"):
        ClosedLoop(tuple(reversed(reqs)), 2)
    with pytest.raises(ValueError, match="concurrency must be an integer >= 1"):
        ClosedLoop(tuple(reqs), 0)
    plan = LoadPlan("random", controls=LoadControls(num_prompts=10, max_concurrency=3, think_time_s=0.5))
    assert plan.run_kwargs() == {"max_concurrency": 3, "think_time_s": 0.5}
    loop = plan.closed_loop(plan.requests())
    assert loop.describe() == {"max_concurrency": 3, "think_time_s": 0.5, "think_time": "fixed",
                               "requests": 10}
