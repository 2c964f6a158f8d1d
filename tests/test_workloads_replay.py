"""Replay controls (window, rate scale, max requests, sampling, output scale) and load_requests."""

import pickle

import pytest

from workloads import (Request, RequestList, TraceError, load_requests, parse_window, replay,
                       sample_fraction, scale_output, scale_rate, select_window, take)


def reqs(times):
    return [Request(i, t, 100 + i, 10 + i) for i, t in enumerate(times)]


def test_window_rebases_and_stops_reading_at_the_end():
    consumed = []

    def source():
        for r in reqs([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]):
            consumed.append(r.id)
            yield r
    out = list(select_window(source(), 1.5, 4.0))
    assert [(r.id, r.arrival_s) for r in out] == [(2, 0.5), (3, 1.5)]
    assert consumed == [0, 1, 2, 3, 4]  # stopped at the first arrival past the window
    assert [r.id for r in select_window(reqs([0, 1, 2]), None, 2)] == [0, 1]
    assert [r.arrival_s for r in select_window(reqs([0, 1, 2]), 1, None)] == [0.0, 1.0]
    with pytest.raises(ValueError, match="window end"):
        list(select_window(reqs([0]), 5, 5))
    with pytest.raises(ValueError, match="not in arrival order"):
        list(select_window(reqs([0, 2, 1]), 0, 10))


def test_rate_scale_compresses_and_stretches():
    assert [r.arrival_s for r in scale_rate(reqs([0, 1, 3]), 2.0)] == [0.0, 0.5, 1.5]
    assert [r.arrival_s for r in scale_rate(reqs([0, 1, 3]), 0.5)] == [0.0, 2.0, 6.0]
    for bad in (0, -1, float("inf")):
        with pytest.raises(ValueError, match="rate_scale must be a finite number > 0"):
            list(scale_rate(reqs([0]), bad))


def test_sampling_is_seeded_and_keeps_the_fraction():
    base = reqs([i * 0.1 for i in range(20_000)])
    a = [r.id for r in sample_fraction(base, 0.25, seed=3)]
    assert a == [r.id for r in sample_fraction(base, 0.25, seed=3)]
    assert a != [r.id for r in sample_fraction(base, 0.25, seed=4)]
    # binomial: sd = sqrt(n p (1-p)) = 61; allow 4 sd
    assert abs(len(a) - 5_000) < 4 * 61
    with pytest.raises(ValueError, match=r"sample fraction must be in \(0, 1\]"):
        list(sample_fraction(base, 0.0))


def test_take_and_output_scale():
    assert [r.id for r in take(reqs([0, 1, 2]), 2)] == [0, 1]
    assert list(take(reqs([0, 1]), 0)) == []
    doubled = list(scale_output(reqs([0, 1]), 2.0))
    assert [r.output_tokens for r in doubled] == [20, 22]
    assert [r.output_tokens for r in scale_output([Request(0, 0, 5, 1)], 0.1)] == [1]


def test_replay_applies_controls_in_order():
    out = list(replay(reqs([0, 1, 2, 3, 4, 5, 6]), window=(2, None), max_requests=3,
                      rate_scale=2.0, output_scale=3.0))
    assert [(r.id, r.arrival_s, r.output_tokens) for r in out] == \
        [(2, 0.0, 36), (3, 0.5, 39), (4, 1.0, 42)]


def test_parse_window():
    assert parse_window("60:180") == (60.0, 180.0)
    assert parse_window(":300") == (None, 300.0)
    with pytest.raises(ValueError, match="START:END"):
        parse_window("60")
    assert parse_window("5:") == (5.0, None)                  # open end
    for bad, msg in (("-5:10", "start must be a finite number of seconds >= 0"),
                     ("nan:10", "start must be"), ("inf:", "start must be"),
                     ("10:5", "end must be after its start"), ("0:nan", "end must be a finite number"),
                     (":-1", "end must be after"),
                     # issue 24: an infinite end, an empty window and other scripts' digits ran everything
                     ("0:inf", r"end must be a finite number .*open end: 0:"), ("", "START:END"),
                     (":", "START:END"), ("0:\u0661\u0660", "START:END")):
        with pytest.raises(ValueError, match=msg):
            parse_window(bad)


def test_load_requests_on_the_shipped_excerpt():
    all_reqs = load_requests("mooncake-excerpt")
    assert isinstance(all_reqs, RequestList) and isinstance(all_reqs, list)
    assert len(all_reqs) == 339 and [r.id for r in all_reqs] == list(range(339))
    part = load_requests("mooncake-excerpt", window=(30, 60), rate_scale=2.0, output_scale=2.0)
    orig = {r.id: r for r in all_reqs}
    assert part and all(30 <= orig[r.id].arrival_s < 60 for r in part)
    assert all(r.arrival_s == pytest.approx((orig[r.id].arrival_s - 30) / 2) for r in part)
    assert all(r.output_tokens == 2 * orig[r.id].output_tokens for r in part)
    assert all(r.block_hashes == orig[r.id].block_hashes for r in part)
    s = part.summary()
    assert s["requests"] == len(part) and s["read_whole_file"] is False
    assert s["controls"]["window"] == [30, 60] and s["skipped_rows"] == 0
    sampled = load_requests("mooncake-excerpt", sample=0.5, seed=1, max_requests=50)
    assert len(sampled) == 50 and sampled == load_requests("mooncake-excerpt", sample=0.5,
                                                           seed=1, max_requests=50)
    assert pickle.loads(pickle.dumps(sampled)).summary() == sampled.summary()


def test_load_requests_nothing_left_is_an_error():
    # a window past the trace's end says where the trace's arrivals are
    with pytest.raises(TraceError, match=r"no requests to replay: none arrives in the window "
                                         r"\[1000, 2000\) s; its arrivals span 0 to 117 s"):
        load_requests("mooncake-excerpt", window=(1000, 2000))
    with pytest.raises(TraceError, match="no requests to replay: none passed the replay controls"):
        load_requests("mooncake-excerpt", sample=1e-9)


def test_an_output_scale_beyond_any_context_names_the_option():
    # --output-scale 1e300 used to fail on "Request 0" with a 300-digit token count
    import pytest

    from workloads import Request
    from workloads.replay import scale_output

    reqs = [Request(id=3, arrival_s=0.0, prompt_tokens=10, output_tokens=500)]
    with pytest.raises(ValueError, match=r"output_scale \(--output-scale\) 1e\+300: request 3's 500 output tokens"):
        list(scale_output(reqs, 1e300))
    assert list(scale_output(reqs, 2.0))[0].output_tokens == 1000
