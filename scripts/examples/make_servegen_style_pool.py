#!/usr/bin/env python3
"""Write the illustrative ServeGen-style client pool in scripts/examples/servegen_style_pool/.

The numbers are made up for rack's example and are NOT from ServeGen: 12 clients over
six 600 s windows, drawn from a seeded generator with shapes like those the ServeGen
paper reports (per-client rates changing every window, some idle windows, bursty gaps
fitted as Weibull with shape < 1 or Gamma with CV > 1, long-tailed prompt lengths,
two reasoning clients with a bimodal reasoning share). The files use ServeGen's
layout so that scripts/servegen_to_workload.py is exercised on it:

    python scripts/examples/make_servegen_style_pool.py
    python scripts/servegen_to_workload.py scripts/examples/servegen_style_pool \\
        --out workloads/data/servegen_example.toml --name servegen-example \\
        --note "Illustrative numbers, NOT from ServeGen (scripts/examples/servegen_style_pool/README.md)."
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "servegen_style_pool"
CLIENTS, WINDOWS, WINDOW_S = 12, 6, 600


def lognormal_pmf(mean: float, cv: float, points: int, rng: np.random.Generator) -> dict[int, float]:
    """A PMF on `points` token counts: a log-normal's quantiles with jittered masses."""
    s = math.sqrt(math.log1p(cv * cv))
    mu = math.log(mean) - s * s / 2
    q = (np.arange(points) + 0.5) / points
    from statistics import NormalDist
    values = np.maximum(1, np.rint(np.exp(mu + s * np.array([NormalDist().inv_cdf(x) for x in q]))))
    p = rng.uniform(0.5, 1.5, points)
    p /= p.sum()
    out: dict[int, float] = {}
    for v, x in zip(values.astype(int).tolist(), p.tolist()):
        out[v] = out.get(v, 0.0) + x
    return out


def main() -> None:
    rng = np.random.default_rng(2026)
    OUT.mkdir(parents=True, exist_ok=True)
    for c in range(CLIENTS):
        base = float(rng.choice([0.2, 0.4, 0.8, 1.5, 3.0]))
        rows = []
        for w in range(WINDOWS):
            if rng.random() < 0.15:
                rows.append(f"{w * WINDOW_S},0,0,,0,0")
                continue
            rate = round(base * float(rng.uniform(0.5, 1.6)), 4)
            if rng.random() < 0.6:
                shape = round(float(rng.uniform(0.35, 0.9)), 4)          # Weibull k < 1: bursty
                scale = 1 / (rate * math.gamma(1 + 1 / shape))
                cv = math.sqrt(math.gamma(1 + 2 / shape) / math.gamma(1 + 1 / shape) ** 2 - 1)
                rows.append(f"{w * WINDOW_S},{rate},{cv:.4f},Weibull,{shape},{scale:.6g}")
            else:
                cv = round(float(rng.uniform(1.2, 4.0)), 4)              # Gamma with CV > 1
                shape = 1 / cv ** 2
                rows.append(f"{w * WINDOW_S},{rate},{cv},Gamma,{shape:.6g},{1 / (rate * shape):.6g}")
        (OUT / f"chunk-{c}-trace.csv").write_text("\n".join(rows) + "\n")
        reasoning = c in (3, 9)
        in_mean = float(rng.choice([300, 800, 2000, 6000]))
        out_mean = 1500.0 if reasoning else float(rng.choice([80, 200, 400]))
        dataset = {}
        for w in (0, 3):                                  # lengths change at window 3
            shift = 1.0 if w == 0 else float(rng.uniform(0.8, 1.25))
            fields = {"input_tokens": lognormal_pmf(in_mean * shift, 1.2, 24, rng),
                      "output_tokens": lognormal_pmf(out_mean * shift, 0.8, 24, rng)}
            if reasoning:
                fields["reason_ratio"] = {0.0: 0.15, 0.6: 0.25, 0.8: 0.4, 0.9: 0.2}
            dataset[str(w * WINDOW_S)] = {k: repr(v) for k, v in fields.items()}
        import json
        (OUT / f"chunk-{c}-dataset.json").write_text(json.dumps(dataset, indent=1) + "\n")
    print(f"wrote {CLIENTS} clients to {OUT}")


if __name__ == "__main__":
    main()
