"""Synthetic generators: statistics within sampling error for fixed seeds, reproducibility."""

import heapq
import math

import numpy as np
import pytest

from workloads import (ClosedLoopSource, ConstantArrivals, EmpiricalLengths, FixedLengths,
                       GammaArrivals, LogNormalLengths, PoissonArrivals, UniformLengths,
                       arrival_times, make_arrivals, make_lengths, synthesize, trace_stats)

N = 20_000


def rate_and_cv(times):
    gaps = np.diff(times)
    return 1.0 / gaps.mean(), gaps.std() / gaps.mean()


@pytest.mark.parametrize("process,cv", [
    (PoissonArrivals(5.0), 1.0),
    (GammaArrivals(5.0, cv=0.5), 0.5),
    (GammaArrivals(5.0, cv=3.0), 3.0),
])
@pytest.mark.parametrize("seed", [0, 7])
def test_rate_and_cv_within_sampling_error(process, cv, seed):
    t = arrival_times(process, n=N, seed=seed)
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0) and t.size == N
    rate, got_cv = rate_and_cv(t)
    # the mean gap's relative standard error is cv / sqrt(n); allow 4 of them
    assert rate == pytest.approx(5.0, rel=4 * cv / math.sqrt(N))
    # sample CV: relative spread ~1.5% at cv=3, n=20,000 (measured over 40 seeds); allow 5%
    assert got_cv == pytest.approx(cv, rel=0.05)


def test_constant_rate_and_duration():
    t = arrival_times(ConstantArrivals(4.0), n=5)
    assert t.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    t = arrival_times(PoissonArrivals(10.0), duration_s=1000, seed=1)
    assert t.max() < 1000 and abs(t.size - 10_000) < 4 * 100  # Poisson count sd = sqrt(10^4)
    assert arrival_times(PoissonArrivals(10.0), n=50, duration_s=1000).size == 50
    with pytest.raises(ValueError, match="give n"):
        arrival_times(PoissonArrivals(1.0))
    with pytest.raises(ValueError, match="cv must be a finite number > 0"):
        GammaArrivals(1.0, cv=0)


def test_length_distributions_means():
    rng = np.random.default_rng(0)
    p, o = FixedLengths(100, 7).sample(10, rng)
    assert set(p.tolist()) == {100} and set(o.tolist()) == {7}
    p, o = UniformLengths(10, 30, 1, 1).sample(N, rng)
    assert p.min() == 10 and p.max() == 30 and set(o.tolist()) == {1}
    # uniform on 10..30: sd 6.06, standard error 0.043
    assert p.mean() == pytest.approx(20.0, abs=4 * 6.06 / math.sqrt(N))
    ln = LogNormalLengths(prompt_mean=2000, prompt_cv=1.5, output_mean=200, output_cv=1.0)
    p, o = ln.sample(N, rng)
    assert p.min() >= 1 and o.min() >= 1
    assert p.mean() == pytest.approx(2000, rel=4 * 1.5 / math.sqrt(N))
    assert o.mean() == pytest.approx(200, rel=4 * 1.0 / math.sqrt(N))
    assert o.std() / o.mean() == pytest.approx(1.0, rel=0.08)
    capped, _ = LogNormalLengths(2000, 1.5, 200, 1.0, prompt_max=4096).sample(1000, rng)
    assert capped.max() <= 4096


def test_empirical_lengths_from_a_trace_keep_pairs_and_means():
    src = EmpiricalLengths.from_trace("mooncake-excerpt")
    assert src.prompt_tokens.size == 339
    pairs = set(zip(src.prompt_tokens.tolist(), src.output_tokens.tolist()))
    p, o = src.sample(N, np.random.default_rng(2))
    assert set(zip(p.tolist(), o.tolist())) <= pairs  # drawn jointly, never mixed
    sd = src.prompt_tokens.std() / math.sqrt(N)
    assert p.mean() == pytest.approx(src.prompt_tokens.mean(), abs=4 * sd)


def test_synthesize_is_reproducible_and_matches_its_parameters():
    lengths = LogNormalLengths(1000, 1.0, 100, 1.0)
    a = synthesize(GammaArrivals(8.0, 2.0), lengths, n=N, seed=11)
    assert a == synthesize(GammaArrivals(8.0, 2.0), lengths, n=N, seed=11)
    assert a != synthesize(GammaArrivals(8.0, 2.0), lengths, n=N, seed=12)
    # arrivals do not move when only the length distribution changes
    b = synthesize(GammaArrivals(8.0, 2.0), FixedLengths(5, 5), n=N, seed=11)
    assert [r.arrival_s for r in a] == [r.arrival_s for r in b]
    assert [r.id for r in a] == list(range(N))
    s = trace_stats(a)
    assert s.rate_mean_per_s == pytest.approx(8.0, rel=4 * 2.0 / math.sqrt(N))
    assert s.interarrival_cv == pytest.approx(2.0, rel=0.05)
    assert s.input_tokens.mean == pytest.approx(1000, rel=4 / math.sqrt(N))


def test_closed_loop_keeps_concurrency_fixed():
    service_s, think_s, conc, n = 2.0, 0.0, 8, 200
    src = ClosedLoopSource(conc, FixedLengths(100, 10), n, think_time_s=think_s, seed=1)
    first = src.start()
    assert len(first) == conc and all(r.arrival_s == 0.0 for r in first)
    events = [(r.arrival_s + service_s, r.id) for r in first]
    heapq.heapify(events)
    arrivals = [r.arrival_s for r in first]
    while events:
        t, _ = heapq.heappop(events)
        assert src.outstanding <= conc
        nxt = src.on_complete(t)
        if nxt is not None:
            arrivals.append(nxt.arrival_s)
            heapq.heappush(events, (nxt.arrival_s + service_s, nxt.id))
    assert src.done and src.issued == n and len(arrivals) == n
    # throughput of a closed loop = concurrency / (service + think) = 4 req/s
    assert (n - conc) / arrivals[-1] == pytest.approx(conc / service_s, rel=0.01)
    with pytest.raises(RuntimeError):
        src.on_complete(99.0)


def test_closed_loop_think_time_mean():
    src = ClosedLoopSource(1, FixedLengths(1, 1), N, think_time_s=3.0, seed=5)
    t = src.start()[0].arrival_s
    gaps = []
    for _ in range(N - 1):
        r = src.on_complete(t)
        gaps.append(r.arrival_s - t)
        t = r.arrival_s
    assert np.mean(gaps) == pytest.approx(3.0, rel=4 / math.sqrt(N))


def test_factories():
    assert make_arrivals("gamma", rate_per_s=2, cv=1.5) == GammaArrivals(2, 1.5)
    assert make_lengths("fixed", prompt_tokens=3, output_tokens=4) == FixedLengths(3, 4)
    assert isinstance(make_lengths("empirical", trace="azure-conv-excerpt"), EmpiricalLengths)
    with pytest.raises(ValueError, match="unknown arrival process 'pareto'"):
        make_arrivals("pareto", rate_per_s=1)
    with pytest.raises(ValueError, match="arrival process 'poisson':"):
        make_arrivals("poisson", rate=1)
    with pytest.raises(ValueError, match=r"prompt_tokens must be an integer in \[1, 100,000,000\]"):
        make_lengths("fixed", prompt_tokens=0, output_tokens=1)
