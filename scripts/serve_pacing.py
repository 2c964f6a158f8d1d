"""Pacing lateness of `rack serve` at a few dilations on this host (docs/serve.md:
choosing a dilation). For each dilation: serve the scenario, stream `--requests`
completions (`--concurrency` at a time, 256 prompt / `--output-tokens` tokens) with the
official `openai` client, and print the front's pacing lateness over the run's chunks
(p50, p99, max, wall ms) beside the emulated ITL in wall time, the client's median
TTFT and ITL against rack's records, and the host's load average.

    python scripts/serve_pacing.py [--dilations 10,20,50,100] [--requests 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np


def _one(url: str, out_tokens: int, i: int) -> dict:
    import openai

    c = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=600, max_retries=0)
    t0 = time.perf_counter()
    times, rid = [], None
    for ch in c.completions.create(model="kimi-k2", prompt=list(range(1 + i, 257 + i)), max_tokens=out_tokens,
                                   stream=True, extra_body={"ignore_eos": True}):
        rid = ch.id
        if ch.choices and ch.choices[0].text:
            times.append(time.perf_counter())
    rec = httpx.get(f"{url}/rack/requests/{rid}", timeout=60).json()
    return {"ttft": times[0] - t0, "itl": float(np.median(np.diff(times))), "rec": rec}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dilations", default="10,20,50,100")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--scenario", default="helios-cs3-kimi-k2")
    a = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from rack.runtime.ray_runtime import ensure_ray
    from rack.serve.session import LiveServer
    from rack.wiring.load import load_scenario

    ensure_ray()
    print(f"{'dilation':>8} {'ITL wall':>9} {'late p50':>9} {'late p99':>9} {'late max':>9} {'p99/ITL':>8} "
          f"{'TTFT cl/rack':>13} {'ITL cl/rack':>12} {'load avg':>9}")
    for d in [float(x) for x in a.dilations.split(",")]:
        srv = LiveServer(load_scenario(a.scenario).with_overrides(dilation=d), host="127.0.0.1", port=0)
        srv.start()
        try:
            srv.pacing_window()
            with ThreadPoolExecutor(a.concurrency) as pool:
                runs = list(pool.map(lambda i: _one(srv.url, a.output_tokens, i), range(a.requests)))
            time.sleep(0.5)
            w = srv.pacing_window()
        finally:
            srv.stop(5.0)
        rack_ttft = [(r["rec"]["t_first_token_s"] - r["rec"]["t_arrival_s"]) * d for r in runs]
        rack_itl = [float(np.median(r["rec"]["itl_s"])) * d for r in runs]
        ms = lambda x: f"{x * 1e3:.2f}"  # noqa: E731
        print(f"{d:>8g} {ms(w['tpot_wall_s']):>9} {ms(w['p50_s']):>9} {ms(w['p99_s']):>9} {ms(w['max_s']):>9} "
              f"{w['p99_s'] / w['tpot_wall_s']:>8.1%} "
              f"{statistics.median(r['ttft'] for r in runs) / statistics.median(rack_ttft):>13.3f} "
              f"{statistics.median(r['itl'] for r in runs) / statistics.median(rack_itl):>12.3f} "
              f"{os.getloadavg()[0]:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
