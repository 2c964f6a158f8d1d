"""Five behaviours that public bug reports in other simulators found (issue 37), each
checked against the physics or the definition it restates, not against rack's output."""

from __future__ import annotations

import numpy as np

from rack.measure import metrics


def test_offered_rate_of_a_steady_window_counts_arrivals_over_a_half_open_interval():
    # Definition: the offered rate is the arrivals of the window per second of it. A
    # trace at exactly 1 request/s puts n arrivals in n seconds: over [start, end) the
    # count is the window's length; a closed interval counts the arrival at `end` too,
    # 17 in 16 s (1.0625 req/s).
    for n in (21, 101, 1001):
        arrivals = np.arange(n, dtype=float)            # 1.000 req/s
        meets = np.ones(n, dtype=bool)
        g = metrics.goodput_section(arrivals, meets, float(n), 2.0, 0.08)
        assert g["basis"] == "steady_state"
        assert g["offered_requests_per_s"] == 1.0, (n, g["offered_requests_per_s"], g["window_s"])
        assert g["requests_per_s"] == 1.0
    # A window whose ends fall between arrivals holds its length x rate arrivals,
    # rounded either way: within one arrival of the rate
    arrivals = np.arange(400) * 0.25
    g = metrics.goodput_section(arrivals, np.ones(400, bool), 100.0, 2.0, 0.08)
    length = g["window_s"][1] - g["window_s"][0]
    assert abs(g["offered_requests_per_s"] - 4.0) <= 1.0 / length


def _spec_scenario(spec: dict | None, layout: str, first_token: str = "decode"):
    from rack.wiring.scenario import parse_scenario

    d = {"name": "spec", "model": "llama-3.1-8b", "slo": {"ttft_ms": 2000, "tpot_ms": 100}}
    if layout == "split":
        d["first_token"] = first_token
        d["pools"] = [{"name": "prefill", "device": "h100", "role": "prefill"},
                      {"name": "decode", "device": "h100", "role": "decode", "speculative": spec}]
        d["links"] = [{"name": "kv", "src": "prefill", "dst": "decode", "bandwidth_GBps": 50.0}]
    elif layout == "wafer":
        from rack.wiring.load import load_scenario

        d = load_scenario("helios-cs3-kimi-k2").model_dump()
        d["pools"][1]["speculative"] = spec
    else:
        d["pools"] = [{"name": "gpu", "device": "h100", "role": "both", "speculative": spec}]
    return parse_scenario(d, "<test>")


def test_speculative_decoding_never_lowers_a_requests_ttft():
    # Physics: the first token needs the whole prompt's prefill; a draft model (or MTP
    # head) only adds work before it (its own prefill of the prompt, its draft passes),
    # and no token of a verification step exists before that step has ended. So the
    # same request, alone in the rack, never gets its first token sooner with
    # speculative decoding. (The wafer used to report it up to 0.4 ms sooner: the first
    # step's tokens were spread over the step, the first one at a fraction of it.)
    from rack.run.runner import run_scenario
    from workloads import Request

    specs = [{"draft_tokens": 3, "acceptance_rate": 0.8, "method": "mtp"},
             {"draft_tokens": 5, "acceptance_rate": 0.95, "method": "mtp"},
             {"draft_tokens": 4, "acceptance_rate": 0.7, "method": "draft_model", "draft_model": "llama-3.2-1b"}]
    cases = [("split", "decode"), ("split", "prefill"), ("both", "decode"), ("wafer", "decode")]
    for prompt, out in ((4000, 50), (300, 2), (17450, 610)):
        req = [Request(id=0, arrival_s=0.0, prompt_tokens=prompt, output_tokens=out)]
        for layout, first in cases:
            base = run_scenario(_spec_scenario(None, layout, first), req).columns["ttft_s"][0]
            for spec in specs:
                if layout == "wafer" and spec["method"] == "draft_model":
                    continue                # a Llama draft does not fit Kimi-K2's vocabulary
                ttft = run_scenario(_spec_scenario(spec, layout, first), req).columns["ttft_s"][0]
                assert ttft >= base, (layout, first, prompt, spec, base, ttft)


def _colocated_passes(device: str, stack: str, batch: int, prompt: int, chunk: int) -> tuple[int, dict]:
    """Mixed iterations a colocated instance ran for one long prompt arriving while
    `batch` one-token-prompt requests decode (their own prefills: one pass)."""
    from rack.run.runner import run_scenario
    from rack.wiring.scenario import parse_scenario
    from workloads import Request

    sc = parse_scenario({"name": "budget", "model": "llama-3.1-8b", "slo": {"ttft_ms": 2000, "tpot_ms": 100},
                         "pools": [{"name": "gpu", "device": device, "stack": stack, "role": "both",
                                    "chunk_tokens": chunk, "prefix_cache": False}]}, "<test>")
    reqs = [Request(id=i, arrival_s=0.0, prompt_tokens=16, output_tokens=2000) for i in range(batch)]
    base = run_scenario(sc, reqs).stats["gpu-0"]["mixed_iterations"]
    reqs.append(Request(id=batch, arrival_s=0.5, prompt_tokens=prompt, output_tokens=2))
    out = run_scenario(sc, reqs)
    assert out.results["requests"]["completed"] == batch + 1
    return out.stats["gpu-0"]["mixed_iterations"] - base, out.stats["gpu-0"]


def test_sglang_chunked_prefill_budget_is_not_cut_by_running_decodes():
    # SGLang's scheduler budgets a prefill batch by chunked_prefill_size alone: in
    # Scheduler.get_new_batch_prefill (python/sglang/srt/managers/scheduler.py) the
    # PrefillAdder gets rem_chunk_tokens=chunked_prefill_size and
    # mixed_with_decode_tokens=running_bs only with --enable-mixed-chunk (off by
    # default); PrefillAdder.__init__ (schedule_policy.py) subtracts only that. So a
    # 4,096-token prompt with a 512-token budget takes 4096 / 512 = 8 passes however
    # many requests decode. vLLM's max_num_batched_tokens counts the decodes' tokens
    # too: with 64 decoding, 448 prompt tokens a pass, ceil(4096 / 448) = 10 passes.
    passes, st = _colocated_passes("h100", "sglang", 64, 4096, 512)
    assert passes == 8, passes
    passes, _ = _colocated_passes("a100", "vllm", 64, 4096, 512)
    assert passes == -(-4096 // (512 - 64)), passes


def _router(policy: str, n: int = 4):
    from rack.serving.router import Router

    r = Router(collector="collector", prefill=[f"prefill-{i}" for i in range(n)], decode_targets=["decode-0"],
               policy=policy)
    return r


def _placed(router) -> list[str]:
    out = [dst for dst, method, args in router.outbox if method == "submit_many" for _ in args[0]]
    router.outbox.clear()
    return out


def test_requests_that_tie_on_every_routing_cost_spread_round_robin_over_the_tied():
    # Definition: a routing policy picks the instance of least cost; when several tie
    # on every cost, nothing prefers the first by name, so they must share the work:
    # round robin among the tied (deterministic). On an idle rack each request finds
    # every instance at zero outstanding work (the previous one's prefill is over).
    from workloads import Request

    for policy in ("least_outstanding_work", "prefix_aware"):
        router = _router(policy)
        placed = []
        for i in range(8):
            router.submit_live(float(i), Request(id=i, arrival_s=float(i), prompt_tokens=1000, output_tokens=10),
                               "front")
            placed += _placed(router)
            for name in router.prefill:          # idle again: each reports no outstanding work
                router.load(float(i) + 0.5, name, 0)
        assert placed == [f"prefill-{i % 4}" for i in range(8)], (policy, placed)
        # simultaneous requests (one tick): the load each adds spreads them too
        router = _router(policy)
        router.start(0.0, [Request(id=i, arrival_s=0.0, prompt_tokens=1000, output_tokens=10) for i in range(8)])
        router.on_wake(0.0)
        assert sorted(_placed(router)) == sorted(f"prefill-{i % 4}" for i in range(8))
    # a tie among some: the least loaded win, in turn
    router = _router("least_outstanding_work")
    router.load(0.0, "prefill-1", 500)
    placed = []
    for i in range(3):
        router.submit_live(0.0, Request(id=i, arrival_s=0.0, prompt_tokens=10, output_tokens=10), "front")
        placed += _placed(router)
        for name in ("prefill-0", "prefill-2", "prefill-3"):
            router.load(0.0, name, 0)
    assert placed == ["prefill-0", "prefill-2", "prefill-3"]


def test_a_preempted_requests_recomputed_tokens_and_readmission_are_in_its_results(tmp_path):
    # Definition (vLLM's recompute preemption): a preempted request's KV is freed; to
    # re-admit it, its prompt and the tokens it had generated are prefilled again. So
    # each request's recomputed tokens lie between its prompt and prompt + output - 1
    # per preemption, their sum is the engine's count, and its re-admission comes after
    # its first admission, which `t_decode_admit` keeps (it is what the client's first
    # token followed: TTFT's path is transfer_end -> decode_admit -> first_token).
    import csv

    from rack.measure.results import write_results
    from rack.run.runner import run_scenario
    from rack.wiring.scenario import parse_scenario
    from workloads import Request

    sc = parse_scenario({"name": "pre", "model": "llama-3.1-8b", "slo": {"ttft_ms": 2000, "tpot_ms": 100},
                         "pools": [{"name": "prefill", "device": "h100", "role": "prefill"},
                                   {"name": "decode", "device": "h100", "role": "decode",
                                    "admission_policy": "preempt", "memory_reserve_fraction": 0.85}],
                         "links": [{"name": "kv", "src": "prefill", "dst": "decode", "bandwidth_GBps": 50.0}]},
                        "<test>")
    reqs = [Request(id=i, arrival_s=i * 0.01, prompt_tokens=4000, output_tokens=2000) for i in range(40)]
    out = run_scenario(sc, reqs)
    c, r = out.columns, out.results["requests"]
    assert r["completed"] == 40 and r["preemptions"] > 0
    assert r["recomputed_tokens"] == out.stats["decode-0"]["recompute_tokens"] == int(c["recomputed_tokens"].sum())
    pre = c["preemptions"] > 0
    assert np.array_equal(c["recomputed_tokens"] > 0, pre)
    assert np.all(c["recomputed_tokens"][pre] >= 4000 * c["preemptions"][pre])
    assert np.all(c["recomputed_tokens"][pre] <= (4000 + 2000 - 1) * c["preemptions"][pre])
    assert np.all(np.isnan(c["t_decode_readmit"][~pre]))
    assert np.all(c["t_decode_readmit"][pre] > c["t_first_token"][pre])
    assert np.all(c["t_decode_admit"] <= c["t_first_token"])       # the first admission
    write_results(tmp_path, out.results, out.columns)
    rows = list(csv.DictReader(open(tmp_path / "requests.csv")))
    assert sum(int(x["recomputed_tokens"]) for x in rows) == r["recomputed_tokens"]
    assert all((x["t_decode_readmit"] != "") == (int(x["preemptions"]) > 0) for x in rows)
