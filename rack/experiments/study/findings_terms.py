"""The parts of findings.md drawn from interactivity curves and uncertain terms: the
curves and the split/wafer ratio at equal interactivity, the agentic sessions' KV work,
the tornado, the break-even map, "what the vendors' 5x requires", the verdicts with
their ranges, "what would settle it", and the short answer ("what rack says"). Every
figure is read from the saved points (`rack.experiments.study.breakeven`)."""

from __future__ import annotations

from typing import Optional

from rack.experiments.report import md_table
from rack.measure.bootstrap import BOOTSTRAP
from rack.experiments.study import breakeven as B
from rack.experiments.study import text as T


def _fig(figures: dict, key: str, fig_dir: str, alt: str) -> list[str]:
    return [f"![{alt}]({fig_dir}/{figures[key]})", ""] if key in figures else []


def _term_value(t: dict, v: Optional[float]) -> str:
    """A term's value with its unit: 3 significant digits, thousands separated."""
    if v is None:
        return "-"
    text = f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    if t.get("unit") == "x":
        return "x" + text           # a factor on a term ("x1.38"), written apart from the page's ratios ("1.38x")
    return text + (f" {t['unit']}" if t.get("unit") else "")


def _range_text(tr: dict) -> str:
    """The span of a ratio over the uncertain terms' ends, each end with its own
    interval where it has one ("-" when none)."""
    ends = tr.get("range_ends")
    if not ends:
        return "-"
    lo, hi = ends
    return f"{T.xi(lo['ratio'], lo['interval'])} to {T.xi(hi['ratio'], hi['interval'])}"


def _reading_note(res: dict) -> str:
    if res.get("reading") == "equal_interactivity":
        at = res.get("at", "a_knee")
        where = ("the split's knee (its best tokens/s per kW meeting its TPOT target, with a lower point after it)"
                 if at == "a_knee" else "the highest ratio over the curves' overlap" if at == "up_to"
                 else f"{at:g} tokens/s per user")
        return (f"both curves read at exactly the same tokens/s per user, at {where}; intervals in brackets: the "
                "points' bootstrap replicates (90 %) widened by the ladder's bracket between measured rungs")
    if res.get("reading") == "at_capacity":
        return ("each deployment read at its own capacity, the highest rate tried at which it meets the SLOs for "
                "the target share of requests")
    at = res.get("at", "a_best")
    where = ("the tokens/s per user of the split's best operating point (its highest tokens/s per kW)"
             if at == "a_best" else f"{at:g} tokens/s per user")
    return (f"read at {where}: each deployment at its best operating point giving every user at least that "
            f"interactivity (within {res['tolerance']:.0%}; measured points or a segment crossing it, never "
            "extrapolated)")


def _stop_text(name: str, d: dict) -> str:
    pts = d.get("points") or []
    top = pts[-1]["concurrency"] if pts else None
    why = {"turned": "its tokens/s per kW fell after its best point",
           "flat": "its tokens/s per kW stopped rising (a rung gained < 5 %)",
           "below_slo": "its tokens/s per user fell "
           "below its TPOT target's", "ladder_end": "**the ladder ended before the curve turned**",
           "failed": "a point failed", "ladder": "every rung ran"}.get(d.get("stop"), d.get("stop") or "-")
    knobs = d.get("variants") or {}
    extra = (f"; knob branches {T.listing([T.code(k) for k in knobs])}" if knobs else "")
    return f"{T.code(name)} up to C={top}: {why}{extra}"


def equal_interactivity(res: dict, s, figures: dict, fig_dir: str) -> list[str]:
    """An interactivity section read at exactly equal tokens/s per user: the ratio at
    the split's knee, at 1,000 tokens/s per user, at the other's knee and its highest
    over the overlap, each with its interval; the physics ceiling beside the
    headline; why each ladder stopped; which curve ends first."""
    from rack.experiments.study.ceiling import physics_ceiling

    rows = B.interactivity_rows(res)
    lines = [f"## {s.title or 'At equal interactivity'}", "",
             "Closed-loop concurrency ladders (`rack sweep interactivity`; rungs "
             f"{T.listing([str(c) for c in s.concurrencies])}, {s.per_slot} units per slot"
             + (", each curve climbing until its tokens/s per kW falls after its best point or its tokens/s per user "
                "falls below its TPOT target's" if s.until_turned else "") + "). The ratio is "
             f"{res['metric'].replace('_', ' ')} of the first deployment over the second, both curves read at exactly "
             "the same tokens/s per user (each interpolated linearly between neighbouring concurrency points, the "
             "best knob branch where a deployment has several; never extrapolated). A knee is a curve's best point "
             "meeting its TPOT target with a lower point after it; a curve's last point is never read as one. In "
             f"brackets every ratio's interval: the ratio recomputed on {BOOTSTRAP} bootstrap resamples of each point's "
             "requests (90 %), widened by the ladder's bracket (between two rungs a curve lies between their chord "
             "and its neighbouring segments extended; nil at a measured point). The ceiling is the physics bound at the headline's tokens/s per user "
             "(`rack.experiments.study.ceiling`: (1 + P/O) x the wafer alone's power / the split's, P and O the "
             "prompt tokens the wafer alone computed and its output tokens).", ""]
    table = []
    notes = []
    for r in rows:
        rd = r["readings"]
        named = {n["name"]: n for n in rd["named"]}
        at_1k = next((n for n in rd["named"] if n["name"].endswith("tokens/s per user")), None)
        kb = named.get(f"{r['b']}'s knee")
        curves = res["workloads"][r["workload"]]["deployments"]
        up = rd["up_to"]
        # beside the headline; where it has no ratio, beside the highest reading
        ceil_x = r["x"] if r["ratio"] is not None or not up else up["x"]
        ceil = physics_ceiling(curves[r["a"]]["points"], curves[r["b"]]["points"], ceil_x)
        head = T.xi(r["ratio"], r["interval"]) if r["ratio"] is not None else f"- ({r['why']})"
        lo_hi = [x for x in rd["curve"]["readings"] if x["ratio"] is not None]
        lo = min(lo_hi, key=lambda x: x["ratio"]) if lo_hi else None
        table.append([r["workload"], _pair_label(r["a"], r["b"]), T.num(r["x"], "{:,.0f}"), head,
                      (T.xi(ceil["ceiling"], ceil["interval"]) + ("" if ceil_x == r["x"] else f" at {ceil_x:,.0f}"))
                      if ceil["ceiling"] is not None else "-",
                      _named_cell(at_1k), _named_cell(kb),
                      (T.xi(up["ratio"], up["interval"]) + f" at {up['x']:,.0f}") if up else "-",
                      (T.xi(lo["ratio"], lo["interval"]) + f" at {lo['x']:,.0f}") if lo else "-"])
        notes += [f"- {r['workload']}, {_pair_label(r['a'], r['b'])}: {n}." for n in rd["notes"]]
        read, read_iv = ((r["ratio"], r["interval"]) if ceil_x == r["x"] else
                         ((up or {}).get("ratio"), (up or {}).get("interval")))
        if ceil["ceiling"] is not None and read is not None and read > ceil["ceiling"]:
            # above only when the intervals say so; else the two cannot be told apart
            apart = bool(read_iv and ceil["interval"] and read_iv[0] > ceil["interval"][1])
            notes.append(f"- {r['workload']}, {_pair_label(r['a'], r['b'])}: the reading ({T.xi(read, read_iv)}) is "
                         + (f"above the physics ceiling ({T.xi(ceil['ceiling'], ceil['interval'])}) beyond both "
                            "intervals: the wafer alone pays more per prompt token than per decode token, or the split "
                            "serves from cache prompts the wafer alone recomputes." if apart else
                            f"at the physics ceiling ({T.xi(ceil['ceiling'], ceil['interval'])}) within their "
                            "intervals: the split gains all that taking the prompts off the wafer can give there."))
    at = res.get("at", "a_knee")
    head_name = ("at the split's knee (tok/s/user)" if at == "a_knee" else "highest over the overlap (tok/s/user)"
                 if at == "up_to" else f"at {at:g} tok/s/user")
    lines += [md_table(["workload", "pair", head_name, "ratio [interval]", "ceiling", "at 1,000 tok/s/user [interval]",
                        "at the other's knee [interval]", "highest over the overlap", "lowest over the overlap"],
                       table), ""]
    for label, curves in res["workloads"].items():
        lines.append(f"- {label}: " + "; ".join(_stop_text(n, d) for n, d in curves["deployments"].items()) + ".")
        for p in curves.get("errors", ()):
            lines.append(f"- {label}: point {p['scenario']} C={p['concurrency']} failed: {p['error']}")
    lines += notes + [""]
    for label in res["workloads"]:
        lines += _fig(figures, f"{s.key} {label}", fig_dir, f"interactivity curves, {label}")
        lines += _fig(figures, f"{s.key} ratio {label}", fig_dir, f"ratio at equal interactivity, {label}")
    return lines


def _named_cell(n: Optional[dict]) -> str:
    if n is None:
        return "-"
    if n.get("ratio") is None:
        if n.get("why"):
            return f"- ({n['why']})"
        who = {"a": "the split does", "b": "the other does", "both": "neither curve does"}.get(n.get("short"), "")
        return f"- ({who} not reach {n['x']:,.0f} tok/s/user)" if n.get("x") is not None else "-"
    return T.xi(n["ratio"], n.get("interval")) + (f" at {n['x']:,.0f}" if "knee" in n["name"] else "")


def interactivity(res: dict, s, figures: dict, fig_dir: str) -> list[str]:
    if res.get("reading") == "equal_interactivity":
        return equal_interactivity(res, s, figures, fig_dir)
    rows = B.interactivity_rows(res)
    lines = [f"## {s.title or 'At equal interactivity'}", "",
             "InferenceX's axes and the vendors' reading (\"tokens per second per kilowatt at a comparable "
             "interactivity point\", AMD newsroom 2026-07-23, footnote MI400-021): closed-loop concurrency "
             "ladders (`rack sweep interactivity`, concurrencies "
             f"{T.listing([str(c) for c in s.concurrencies])}, {s.per_slot} units per slot), throughput per "
             "kW against tokens/s per user, one curve per deployment. The ratio is "
             f"{res['metric'].replace('_', ' ')} of the first deployment over the second, {_reading_note(res)}; "
             "its range is over every measured tokens/s per user both curves reach. The last column reads both "
             "curves at exactly the same tokens/s per user, interpolated: where a curve is nearly vertical (a "
             "wafer's decode speed barely moves with load) a few tokens/s per user span its whole throughput "
             "range, so that reading swings widely (docs/interactivity.md); the verdicts use the first.", ""]
    table = [[r["workload"], T.code(r["a"]), T.code(r["b"]), T.num(r["x"], "{:,.0f}"), T.x(r["ratio"]),
              T.span(r["range"] or []), T.span(r["equal"] or [])] for r in rows]
    lines += [md_table(["workload", "split", "against", "read at (tok/s/user)", "ratio", "range over x (at least x)",
                        "range at exactly equal x"], table), ""]
    for label, curves in res["workloads"].items():
        spans = []
        for n, d in curves["deployments"].items():
            xs = [p["tps_user_p50"] for p in d["points"] if p.get("tps_user_p50") is not None]
            if xs:
                spans.append(f"{T.code(n)} {min(xs):,.0f}-{max(xs):,.0f}")
        if spans:
            lines.append(f"- {label}: tokens/s per user (p50) over the ladder: " + "; ".join(spans) + ".")
        for p in curves.get("errors", ()):
            lines.append(f"- {label}: point {p['scenario']} C={p['concurrency']} failed: {p['error']}")
    lines.append("")
    for label in res["workloads"]:
        lines += _fig(figures, f"{s.key} {label}", fig_dir, f"interactivity curves, {label}")
    return lines


def kv_reuse(results: dict, s, figures: dict, fig_dir: str) -> list[str]:
    res = results.get(s.source)
    if not res:
        return []
    lines = [f"## {s.title or 'Agentic sessions: the KV cache'}", ""]
    heads = ["workload", "deployment", "C", "prefix hit", "ideal", "recomputed tokens", "prompt tokens computed",
             "KV shipped per turn (GB)", "TTFT p90 (s)"]
    rows = []
    for label, curves in res["workloads"].items():
        if curves["recipe"].get("source") != "workload" and "session" not in label:
            continue
        for n, d in curves["deployments"].items():
            if not d["points"]:
                continue
            p = max(d["points"], key=lambda q: q["concurrency"])
            rows.append([label, T.code(n), str(p["concurrency"]), T.num(p["prefix_hit_ratio"], "{:.3f}"),
                         T.num(p["ideal_prefix_hit_ratio"], "{:.3f}"), T.num(p["recomputed_tokens"], "{:,.0f}"),
                         T.num(p["prompt_tokens_computed"], "{:,.0f}"),
                         T.num(None if p["kv_bytes_per_turn"] is None else p["kv_bytes_per_turn"] / 1e9, "{:.3g}"),
                         T.secs(p["ttft_p90_s"])])
    if not rows:
        return []
    lines += ["Per deployment at the highest concurrency of the ladder (section "
              f"`{s.source}`): the prefix cache's hit ratio (hit over looked-up blocks) against an unbounded "
              "cache's, the prompt tokens an earlier turn had computed and that were computed again (evicted "
              "from the wafer's SRAM, or cached on another instance), all prompt tokens computed, and the KV the "
              "split ships over its link per turn (each turn's whole context).", "", md_table(heads, rows), ""]
    return lines


def _pair_label(a: str, b: str) -> str:
    return f"{T.code(a)} / {T.code(b)}"


def tornado(res: dict, s, figures: dict, fig_dir: str) -> list[str]:
    cap = res.get("reading") == "at_capacity"
    how = (f"rates {T.num(min(res['rates']), '{:g}')}x to {T.num(max(res['rates']), '{:g}')}x the trace's own, "
           f"{len(res['rates'])} of them" if cap else
           f"concurrencies {T.listing([str(c) for c in res['concurrencies']])}, {res['per_slot']} units per slot")
    lines = [f"## {s.title or 'The uncertain terms'}", "",
             f"The ratio of {res['metric'].replace('_', ' ')} "
             + ("at capacity" if cap else "at equal interactivity") + f" on {res['workload']} ({_reading_note(res)}), "
             "with each uncertain term set to the low and the high end of its documented range "
             f"(`devices.uncertainty`; the other terms as shipped; {how}). Terms sorted by how far they move it.", ""]
    for a, b in res["pairs"]:
        tr = B.tornado_rows(res, a, b)
        eq = res.get("reading") == "equal_interactivity"

        def rx(v, iv):
            return T.xi(v, iv) if eq or iv else T.x(v)

        rows = [[t["label"] + (" (energy only: as-shipped runs rescaled)" if t["key"] in res.get("rerun_free", ())
                               else ""),
                 _term_value(t, t["low"]), _term_value(t, t.get("nominal")), _term_value(t, t["high"]),
                 rx(t["low_ratio"], t.get("low_interval")) if t["low_ratio"] else t["notes"].get("low", "-"),
                 rx(t["high_ratio"], t.get("high_interval")) if t["high_ratio"] else t["notes"].get("high", "-"),
                 T.listing([_term_value(t, v) for v in t["flips_at"]], "-")] for t in tr["terms"]]
        base = tr["baseline"]
        read_at = (f" (read at {base['x']:,.0f} tokens/s per user)" if eq and base.get("x") else "")
        lines += [f"**{_pair_label(a, b)}**: {rx(base['ratio'], base.get('interval'))} as shipped{read_at}"
                  + (f" ({base['why']})" if base["ratio"] is None and base.get("why") else "")
                  + f"; {_range_text(tr)} over the terms' ranges.", "",
                  md_table(["term", "low", "nominal", "high", "ratio at low", "ratio at high", "crosses 1x at"],
                           rows), ""]
        lines += _fig(figures, f"{s.key} {a}", fig_dir, f"tornado, {a} / {b}")
    sourced = [t for t in res["terms"] if t.get("sources")]
    if sourced:
        lines += ["Where each range comes from (`devices.uncertainty`):", ""]
        lines += [f"- {t['label']}: " + "; ".join(t["sources"]) + "." for t in sourced] + [""]
    for p in res.get("errors", ()):
        lines.append(f"- point {p['scenario']} {'C=' + str(p.get('concurrency')) if 'concurrency' in p else ''} "
                     f"failed: {p['error']}")
    return lines + [""]


def breakeven_map(res: dict, s, figures: dict, fig_dir: str) -> list[str]:
    t = res["term"]
    lines = [f"## {s.title or 'Break-even map'}", "",
             f"The ratio at equal interactivity ({_reading_note(res)}) over {t['label']} from "
             f"{_term_value(t, t['low'])} to {_term_value(t, t['high'])} and the input/output ratio of vLLM's "
             f"random dataset ({res['output_tokens']} output tokens, prompts that many times longer), every other "
             "term as shipped. The wafer's per-request prefill rate is `devices.uncertainty.wafer_prefill_rate` "
             "of the wafer-only deployment at that prompt length. The figure's colours and contours are interpolated "
             "between the measured cells (the dots).", ""]
    for a, b in res["pairs"]:
        g = B.map_grid(res, a, b)
        heads = ["input/output"] + [_term_value(t, x) for x in g["x"]]
        rows = []
        eq = res.get("reading") == "equal_interactivity"
        for y, row, rate, ivs in zip(g["y"], g["ratio"], g["rate"], g["interval"]):
            cells = [(T.xi(v, iv) if eq else T.x(v)) + (f" ({r:,.0f} tok/s)" if r else "")
                     for v, r, iv in zip(row, rate, ivs)]
            rows.append([f"{y:g}"] + cells)
        vals = [v for row in g["ratio"] for v in row if v is not None]
        ends = [(v, iv) for row, irow in zip(g["ratio"], g["interval"]) for v, iv in zip(row, irow) if v is not None]
        has_rate = any(r for row in g["rate"] for r in row)
        lines += [f"**{_pair_label(a, b)}** (columns: {t['label']}"
                  + ("; in brackets the wafer's per-request prefill rate" if has_rate else "") + "):", "",
                  md_table(heads, rows), ""]
        if vals:
            lo, hi = min(ends, key=lambda e: e[0]), max(ends, key=lambda e: e[0])
            span = (f"{T.xi(*lo)} to {T.xi(*hi)}" if eq else f"{T.x(lo[0])} to {T.x(hi[0])}")
            lines.append(f"Over the map the ratio runs from {span}; "
                         + ("the 1x contour is drawn" if min(vals) < 1 < max(vals) else "it does not cross 1x")
                         + (" and the 5x contour is drawn." if min(vals) < B.CLAIM < max(vals) else
                            f" and it does not reach {B.CLAIM:g}x." if max(vals) < B.CLAIM else "."))
            lines.append("")
        lines += _fig(figures, f"{s.key} {a}", fig_dir, f"break-even map, {a} / {b}")
    return lines


def five_x(results: dict, sections: list, s) -> list[str]:
    """The page's "what the vendors' 5x requires": each reading as shipped against the
    claim, the term values at which a tornado moves it across the claim (interpolated
    between measured points) or the ends that land on the other side, and the
    break-even map's cells on either side."""
    claim = f"{B.CLAIM:g}x"
    shipped, moves, cells = [], [], []
    for r, tr, _ in _readings(results, sections):
        if r["ratio"] is None:
            continue
        pair = _pair_label(r["a"], r["b"])
        eq = "interval" in r
        shipped.append([r["workload"], pair, T.xi(r["ratio"], r["interval"]) if eq else T.x(r["ratio"]),
                        "holds" if r["ratio"] >= B.CLAIM else "short"])
        for t in (tr["terms"] if tr else []):
            for v in t["reaches"]:
                moves.append([r["workload"], pair, _crossing_text(t, v),
                              f"{claim} or more (interpolated between measured points)"])
            for end in ("low", "high"):
                e = t[f"{end}_ratio"]
                if e is not None and (e >= B.CLAIM) != (r["ratio"] >= B.CLAIM) and not t["reaches"]:
                    moves.append([r["workload"], pair, f"{t['label']} = {_term_value(t, t[end])}",
                                  T.xi(e, t.get(f"{end}_interval")) if eq else T.x(e)])
    for sec in sections:
        res = results.get(sec.key)
        if res is not None and sec.kind == "breakeven_map":
            for a, b in res["pairs"]:
                for c in B.map_grid(res, a, b)["cells"]:
                    if c["ratio"] is not None:
                        cells.append((c, _pair_label(a, b), res["term"]))
    if not shipped and not cells:
        return []
    lines = [f"## {s.title or 'What the vendors 5x requires'}", ""]
    cv = claim_verdict(results, sections)
    if cv:
        lines += [cv["text"], ""]
    lines += [f"The vendors' \"up to {claim}\" against each split/wafer ratio of tokens/s per kW at equal "
              "interactivity, with every term as shipped:", ""]
    if shipped:
        lines += [md_table(["workload", "pair", "ratio", f"against {claim}"], shipped), ""]
    if moves:
        lines += [f"What moves a reading across {claim} (the tornado sections: one term at a time, the others as "
                  "shipped):", "", md_table(["workload", "pair", "condition", "ratio"], moves), ""]
    elif shipped:
        lines += [f"No term moves a reading across {claim} within its documented range (the tornado sections).", ""]
    if cells:
        up = [c for c, _, _ in cells if c["ratio"] >= B.CLAIM]
        down = [(c, pair, t) for c, pair, t in cells if c["ratio"] < B.CLAIM]
        lines.append(f"On the break-even map {len(up)} of {len(cells)} cells reach {claim}"
                     + (": below it " + T.listing([f"{pair} at input/output {c['io_ratio']:g}, {t['label']} = "
                                                   f"{c['x']:g} {t.get('unit', '')}".rstrip()
                                                   + f" ({_cell_ratio(c)})"
                                                   for c, pair, t in down[:6]]) if down else "")
                     + ".")
        lines.append("")
    return lines


def _cell_ratio(c: dict) -> str:
    """A break-even cell's ratio, with its interval where the reading has one."""
    return T.xi(c["ratio"], c["interval"]) if c.get("interval") else T.x(c["ratio"])


def _verdict_word(lo: Optional[float], hi: Optional[float]) -> str:
    from rack.experiments.sweep import TIE_TOLERANCE

    if lo is None or hi is None:
        return "undetermined"
    if lo > 1 + TIE_TOLERANCE:
        return "wins"
    if hi < 1 - TIE_TOLERANCE:
        return "loses"
    return "undetermined" if lo < 1 - TIE_TOLERANCE and hi > 1 + TIE_TOLERANCE else "ties"


def _unbounded(tr: dict) -> Optional[tuple[str, str]]:
    """At capacity, where one deployment sustains no rate tried in every run of a
    tornado (as shipped and at each term's end), the ratio is unbounded but the verdict
    is not: that shared (verdict, why), or None."""
    base = tr["baseline"]
    if base.get("ratio") is not None or base.get("verdict") not in ("wins", "loses") or not base.get("why"):
        return None
    note = f"{base['verdict']}: {base['why']}"
    ends = [t.get("notes", {}).get(end) for t in tr["terms"] for end in ("low", "high")]
    return (base["verdict"], base["why"]) if ends and all(e == note for e in ends) else None


def _verdict(head: str, ratio: Optional[float], tr: Optional[dict], why: str, item: dict) -> dict:
    """A verdict line from a ratio as shipped and its tornado (None: not swept)."""
    unbounded = _unbounded(tr) if tr is not None and ratio is None else None
    if unbounded:
        word, why = unbounded
        return {**item, "text": head.rstrip(": -") + f": {why}, as shipped and at every term's end, so the split "
                f"{word} across the ranges (the ratio is unbounded)", "ratio": None, "range": None,
                "term": None, "flips": [], "verdict": word}
    if tr is not None and tr["range"] is None:
        base = tr["baseline"]
        why = ("the tornado of this pair read no ratio"
               + (f": as shipped, {base['why']}" if base.get("why") else ""))
    if tr is None or tr["range"] is None or ratio is None:
        return {**item, "text": head + f" (no range over the uncertain terms: {why})", "ratio": ratio,
                "range": None, "term": None, "flips": [], "verdict": None}
    ends = [{"ratio": ratio, "interval": item.get("interval")}] + list(tr.get("range_ends") or [])
    lo_e, hi_e = min(ends, key=lambda e: e["ratio"]), max(ends, key=lambda e: e["ratio"])
    lo, hi = lo_e["ratio"], hi_e["ratio"]
    word = _verdict_word(lo, hi)
    ms = tr["most_sensitive"]
    flips = [(t, v) for t in tr["terms"] for v in t["flips_at"]]
    rng = (f"{T.xi(lo, lo_e['interval'])} to {T.xi(hi, hi_e['interval'])}" if item.get("interval") is not None
           or any(e["interval"] for e in ends) else T.span([lo, hi]))
    text = head + f", {rng} over the uncertain terms' ranges" + \
        (f"; most sensitive to {ms['label']}" if ms else "")
    notes = [f"with {t['label']} = {_term_value(t, t[end])} {note}" for t in tr["terms"]
             for end, note in t.get("notes", {}).items()]
    if notes:
        text += " (" + "; ".join(notes) + ")"
    if word == "undetermined" and flips:
        text += ": **undetermined: flips at " + T.listing([f"{t['label']} = {_term_value(t, v)}"
                                                            for t, v in flips]) + "**"
    elif word == "undetermined":
        text += ": **undetermined** (the range straddles 1x)"
    else:
        text += f": the split {word} across the ranges"
    return {**item, "text": text, "ratio": ratio, "range": [lo, hi], "range_ends": [lo_e, hi_e],
            "term": ms["key"] if ms else None,
            "flips": [[t["key"], v] for t, v in flips], "verdict": word}


def _readings(results: dict, sections: list):
    """Every interactivity section's (row, the tornado of that pair on that workload or
    None, the pair's tornado on any workload or None), in the spec's order."""
    dumped = [x.model_dump() for x in sections]
    for s in sections:
        res = results.get(s.key)
        if res is not None and s.kind == "interactivity":
            for r in B.interactivity_rows(res):
                yield (r, B.tornado_for(results, dumped, r["a"], r["b"], r["workload"]),
                       B.tornado_for(results, dumped, r["a"], r["b"]))


def verdict_lines(results: dict, sections: list) -> list[dict]:
    """One verdict per interactivity pair and workload, and one per pair of a tornado
    read at capacity: {"text", "ratio", "range", "term", "flips", "verdict", "a", "b",
    "workload", "reading"}; the range and the most sensitive term from the tornado of
    that pair on that workload (none where no tornado ran there: the line says so)."""
    out = []
    for r, tr, other in _readings(results, sections):
        why = f"the uncertain terms were swept on {other['workload']} only" if other else "no tornado of this pair"
        eq = "interval" in r
        at = f" at {r['x']:,.0f} tokens/s per user" if eq and r.get("x") is not None else ""
        shown = T.xi(r["ratio"], r["interval"]) if eq and r["ratio"] is not None else T.x(r["ratio"])
        if r["ratio"] is None and r.get("why"):
            shown += f" ({r['why']})"
        head = f"{_pair_label(r['a'], r['b'])} tokens/s per kW at equal interactivity{at}, {r['workload']}: {shown}"
        out.append(_verdict(head, r["ratio"], tr, why, {"a": r["a"], "b": r["b"], "workload": r["workload"],
                                                        "reading": "equal_interactivity",
                                                        "interval": r.get("interval"), "up_to": r.get("readings", {})
                                                        .get("up_to") if eq else None}))
    for s in sections:
        res = results.get(s.key)
        if res is not None and s.kind == "tornado" and res.get("reading") == "at_capacity":
            for a, b in res["pairs"]:
                tr = B.tornado_rows(res, a, b)
                metric = {"tokens_per_joule": "tokens/J", "usd_per_mtok": "$/Mtok"}.get(res["metric"], res["metric"])
                base = tr["baseline"]
                head = (f"{_pair_label(a, b)} {metric} at each one's capacity, {res['workload']}: "
                        f"{T.xi(base['ratio'], base.get('interval'))}")
                out.append(_verdict(head, base["ratio"], tr, "no ratio as shipped",
                                    {"a": a, "b": b, "workload": res["workload"], "reading": "at_capacity",
                                     "interval": base.get("interval"), "range_ends": tr.get("range_ends")}))
    return out


def verdicts(results: dict, sections: list, s) -> list[str]:
    v = verdict_lines(results, sections)
    if not v:
        return []
    return [f"## {s.title or 'Verdicts with their conditions'}", "",
            "Each verdict, with the range it takes when every uncertain term moves across its documented range one "
            "at a time (the tornado sections), and the term it moves with most. The other verdicts at capacity in "
            "the sections above are read with every term as shipped.", ""] + \
        [f"- {x['text']}." for x in v] + [""]


def settle(results: dict, sections: list, s) -> list[str]:
    rows = B.settle(results, [x.model_dump() for x in sections])
    if not rows:
        return []
    lines = [f"## {s.title or 'What would settle it'}", "",
             "The measurements that would narrow the verdict most, in order of how far each term's documented range "
             f"moves {rows[0]['pair']} at equal interactivity:", ""]
    for i, r in enumerate(rows[:6], 1):
        t = r["term"]
        lines.append(f"{i}. {t['label']}" + (f" ({t['doc']})" if t.get("doc") else "") + f": measured anywhere in "
                     f"{_term_value(t, t['low'])} to {_term_value(t, t['high'])}, the ratio moves from "
                     f"{T.xi(r['low_ratio'], r.get('low_interval'))} to {T.xi(r['high_ratio'], r.get('high_interval'))}"
                     + (f"; it crosses 1x at {T.listing([_term_value(t, v) for v in r['flips']])}" if r["flips"] else "")
                     + ".")
    return lines + [""]


def _crossing_text(t: dict, v: float) -> str:
    """ "<term> >= v" or "<term> <= v": the side of a crossing at which the ratio is
    above the claim (from which end of the term's range is higher)."""
    up = (t.get("high_ratio") or 0) >= (t.get("low_ratio") or 0)
    return f"{t['label']} {'>=' if up else '<='} {_term_value(t, v)}"


def _five_x_sentence(results: dict, sections: list, v: list[dict], who) -> str:
    """Where the vendors' 5x holds with every term as shipped, and for each reading
    where it does not, the term values that reach it (from that pair's tornado on that
    workload) or the highest ratio within the ranges."""
    dumped = [x.model_dump() for x in sections]
    held = [x for x in v if x["ratio"] is not None and x["ratio"] >= B.CLAIM]
    short = [x for x in v if x["ratio"] is not None and x["ratio"] < B.CLAIM]
    parts = []
    if held:
        parts.append(f"The vendors' {B.CLAIM:g}x holds as shipped for "
                     + T.listing([f"{who(x['a'])} on {x['workload']}" for x in held]))
    for x in short:
        tr = B.tornado_for(results, dumped, x["a"], x["b"], x["workload"])
        needs = [_crossing_text(t, c) for t in (tr["terms"] if tr else []) for c in t["reaches"]]
        shown = T.xi(x["ratio"], x["interval"]) if "interval" in x else T.x(x["ratio"])
        where = f"{who(x['a'])} on {x['workload']} ({shown})"
        if needs:
            parts.append(f"{where} reaches it only with {T.listing(needs[:2])}")
        elif tr and tr["range"]:
            top = (tr.get("range_ends") or [None, {"ratio": tr["range"][1], "interval": None}])[1]
            top_text = T.xi(top["ratio"], top["interval"]) if "interval" in x else T.x(top["ratio"])
            parts.append(f"{where} does not reach it within the ranges (at most {top_text})")
        else:
            parts.append(f"{where} does not reach it as shipped (its terms not swept)")
    if not parts:
        return ""
    text = "; ".join(parts) + "."
    return text if held else f"Against the vendors' {B.CLAIM:g}x: " + text


def what_rack_says(results: dict, sections: list) -> list[str]:
    """The answer with its conditions in three sentences or fewer (README's "what rack
    says" and the top of findings.md), built from the verdicts and the 5x table."""
    every = verdict_lines(results, sections)
    v = [x for x in every if x["reading"] == "equal_interactivity"]
    if not v:
        return []
    ranged = [x for x in v if x["range"]]
    gpus = results.get("deployments", {})

    models = {(gpus.get(x["a"]) or {}).get("model") for x in v}

    def who(name: str) -> str:
        d = gpus.get(name)
        n = sum(p["devices"] for p in d["pools"].values() if p["kind"] == "gpu") if d else None
        # several models in the readings: each names its own
        return (f"{n} GPUs" + (f" with {d['model']}" if len(models) > 1 and d.get("model") else "")) if n else name

    def rx(x: dict) -> str:
        return T.xi(x["ratio"], x["interval"]) if "interval" in x else T.x(x["ratio"])

    read = [x for x in v if x["ratio"]]
    s1 = ("At equal interactivity with every uncertain term as shipped, GPU prefill + wafer decode gives "
          + T.listing([f"{rx(x)} ({who(x['a'])}, {x['workload']})" for x in read][:6])
          + " the wafer alone's tokens/s per kW." if read else
          "At equal interactivity no split/wafer-alone ratio could be read with every term as shipped (the "
          "verdicts below say why for each).")
    labels = {t["key"]: t["label"] for s in sections if s.kind == "tornado" and results.get(s.key)
              for t in results[s.key]["terms"]}
    if ranged:
        ends = [e for x in ranged for e in (x.get("range_ends") or
                                            [{"ratio": x["range"][0], "interval": None},
                                             {"ratio": x["range"][1], "interval": None}])]
        lo_e, hi_e = min(ends, key=lambda e: e["ratio"]), max(ends, key=lambda e: e["ratio"])
        terms = [x["term"] for x in ranged if x["term"]]
        top = max(set(terms), key=terms.count) if terms else None
        flips = [x for x in ranged if x["verdict"] == "undetermined"]
        s2 = (f"Over the uncertain terms' documented ranges that ratio spans {T.xi(lo_e['ratio'], lo_e['interval'])} "
              f"to {T.xi(hi_e['ratio'], hi_e['interval'])}, most sensitive "
              f"to {labels.get(top, top)}" + (f", so the verdict is undetermined in {len(flips)} of {len(ranged)} "
                                              "readings" if flips else ""))
        cap = [x for x in every if x["reading"] == "at_capacity" and x["range"]]
        if cap:
            cends = [e for x in cap for e in (x.get("range_ends") or [])]
            if cends:
                clo, chi = min(cends, key=lambda e: e["ratio"]), max(cends, key=lambda e: e["ratio"])
                s2 += (f"; at each one's capacity the tokens/J ratio spans {T.xi(clo['ratio'], clo['interval'])} "
                       f"to {T.xi(chi['ratio'], chi['interval'])}")
        s2 += "."
    else:
        s2 = "The uncertain terms were not swept."
    cv = claim_verdict(results, sections)
    s3 = cv["short"] if cv else _five_x_sentence(results, sections, v, who)
    return [" ".join(x for x in (s1, s2, s3) if x)]


def claim_verdict(results: dict, sections: list) -> Optional[dict]:
    """Where the vendors' "up to 5x tokens/s per kW at comparable interactivity on
    Kimi 2.6" falls against rack's range for the claim's own pair (the section keyed
    "vendor_claim", else the first interactivity section whose deployments run
    Kimi-K2.6), read at equal interactivity.

    rack's range: the highest ratio over the curves' overlap (the vendors' "up to"),
    from its interval's low end to the highest end of the uncertain terms' range
    of that pair (its tornado on that workload, where one ran; else the interval alone).
    Returns {"position": "inside" | "above" | "below", "low", "high", "term" (the term
    whose range carries the reading across 5x, or the most sensitive one), "text",
    "short"}, or None when no such reading exists."""
    dumped = [x.model_dump() for x in sections]
    pick = next((x for x in sections if x.key == "vendor_claim" and results.get(x.key)), None)
    if pick is None:
        deps = results.get("deployments", {})
        pick = next((x for x in sections if x.kind == "interactivity" and results.get(x.key)
                     and any("k2.6" in (deps.get(n, {}).get("model") or n) for n in x.deployments)), None)
    if pick is None or results[pick.key].get("reading") != "equal_interactivity":
        return None
    best = None
    for r in B.interactivity_rows(results[pick.key]):
        up = (r.get("readings") or {}).get("up_to")
        if up and (best is None or up["ratio"] > best[1]["ratio"]):
            best = (r, up)
    if best is None:
        return None
    r, up = best
    iv = up.get("interval") or [up["ratio"], up["ratio"]]
    low, high = min(iv[0], up["ratio"]), max(iv[1], up["ratio"])
    tr = B.tornado_for(results, dumped, r["a"], r["b"], r["workload"])
    term = None
    if tr and tr["range"]:
        low, high = min(low, tr["range"][0]), max(high, tr["range"][1])
        reach = [t for t in tr["terms"] if t["reaches"]]
        term = (reach or [tr["most_sensitive"]])[0] if (reach or tr["most_sensitive"]) else None
    pos = "above" if B.CLAIM > high else "below" if B.CLAIM < low else "inside"
    where = {"above": "above rack's range", "below": "below rack's range", "inside": "inside rack's range"}[pos]
    decides = (f"; the term that decides it: {term['label']} (documented range {_term_value(term, term['low'])} "
               f"to {_term_value(term, term['high'])})" if term else
               "; no uncertain term of this pair was swept, so its range is the reading's interval only"
               if not tr else "; its tornado read no ratio" + (f" ({tr['baseline']['why']})"
                                                             if tr["baseline"].get("why") else "")
               + ", so its range is the reading's interval only")
    text = (f"**The vendors' claim** (\"up to {B.CLAIM:g}x\" tokens/s per kW at comparable interactivity on "
            f"Kimi 2.6) is **{where}**: {_pair_label(r['a'], r['b'])} on {r['workload']} reaches at most "
            f"{T.xi(up['ratio'], up.get('interval'))} at {up['x']:,.0f} tokens/s per user (the highest ratio over the "
            f"curves' overlap, both read at the same tokens/s per user), rack's range [{low:.2f}-{high:.2f}x] "
            f"(that interval and the uncertain terms' ends){decides}.")
    short = (f"The vendors' \"up to {B.CLAIM:g}x\" on Kimi 2.6 is {where} ([{low:.2f}-{high:.2f}x], at most "
             f"{T.xi(up['ratio'], up.get('interval'))} on {r['workload']})"
             + (f", decided by {term['label']}" if term else "") + ".")
    return {"position": pos, "low": low, "high": high, "term": term["key"] if term else None, "text": text,
            "short": short, "a": r["a"], "b": r["b"], "workload": r["workload"]}


__all__ = ["breakeven_map", "claim_verdict", "equal_interactivity", "five_x", "interactivity", "kv_reuse", "settle", "tornado", "verdict_lines", "verdicts",
           "what_rack_says"]
