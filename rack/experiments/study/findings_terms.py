"""The parts of findings.md drawn from interactivity curves and uncertain terms: the
curves and the split/wafer ratio at equal interactivity, the agentic sessions' KV work,
the tornado, the break-even map, "what the vendors' 5x requires", the verdicts with
their ranges, "what would settle it", and the short answer ("what rack says"). Every
figure is read from the saved points (`rack.experiments.study.breakeven`)."""

from __future__ import annotations

from typing import Optional

from rack.experiments.report import md_table
from rack.experiments.study import breakeven as B
from rack.experiments.study import text as T


def _fig(figures: dict, key: str, fig_dir: str, alt: str) -> list[str]:
    return [f"![{alt}]({fig_dir}/{figures[key]})", ""] if key in figures else []


def _term_value(t: dict, v: Optional[float]) -> str:
    """A term's value with its unit: 3 significant digits, thousands separated."""
    if v is None:
        return "-"
    text = f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    return text + (f" {t['unit']}" if t.get("unit") and t["unit"] != "x" else ("x" if t.get("unit") == "x" else ""))


def _reading_note(res: dict) -> str:
    if res.get("reading") == "at_capacity":
        return ("each deployment read at its own capacity, the highest rate tried at which it meets the SLOs for "
                "the target share of requests")
    at = res.get("at", "a_best")
    where = ("the tokens/s per user of the split's best operating point (its highest tokens/s per kW)"
             if at == "a_best" else f"{at:g} tokens/s per user")
    return (f"read at {where}: each deployment at its best operating point giving every user at least that "
            f"interactivity (within {res['tolerance']:.0%}; measured points or a segment crossing it, never "
            "extrapolated)")


def interactivity(res: dict, s, figures: dict, fig_dir: str) -> list[str]:
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
        rows = [[t["label"], _term_value(t, t["low"]), _term_value(t, t.get("nominal")), _term_value(t, t["high"]),
                 T.x(t["low_ratio"]) if t["low_ratio"] else t["notes"].get("low", "-"),
                 T.x(t["high_ratio"]) if t["high_ratio"] else t["notes"].get("high", "-"),
                 T.listing([_term_value(t, v) for v in t["flips_at"]], "-")] for t in tr["terms"]]
        lines += [f"**{_pair_label(a, b)}**: {T.x(tr['baseline']['ratio'])} as shipped; "
                  f"{T.span(tr['range'] or [])} over the terms' ranges.", "",
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
        for y, row, rate in zip(g["y"], g["ratio"], g["rate"]):
            cells = [T.x(v) + (f" ({r:,.0f} tok/s)" if r else "") for v, r in zip(row, rate)]
            rows.append([f"{y:g}"] + cells)
        vals = [v for row in g["ratio"] for v in row if v is not None]
        has_rate = any(r for row in g["rate"] for r in row)
        lines += [f"**{_pair_label(a, b)}** (columns: {t['label']}"
                  + ("; in brackets the wafer's per-request prefill rate" if has_rate else "") + "):", "",
                  md_table(heads, rows), ""]
        if vals:
            lines.append(f"Over the map the ratio runs from {T.x(min(vals))} to {T.x(max(vals))}; "
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
        shipped.append([r["workload"], pair, T.x(r["ratio"]), "holds" if r["ratio"] >= B.CLAIM else "short"])
        for t in (tr["terms"] if tr else []):
            for v in t["reaches"]:
                moves.append([r["workload"], pair, _crossing_text(t, v),
                              f"{claim} or more (interpolated between measured points)"])
            for end in ("low", "high"):
                e = t[f"{end}_ratio"]
                if e is not None and (e >= B.CLAIM) != (r["ratio"] >= B.CLAIM) and not t["reaches"]:
                    moves.append([r["workload"], pair, f"{t['label']} = {_term_value(t, t[end])}", T.x(e)])
    for sec in sections:
        res = results.get(sec.key)
        if res is not None and sec.kind == "breakeven_map":
            for a, b in res["pairs"]:
                for c in B.map_grid(res, a, b)["cells"]:
                    if c["ratio"] is not None:
                        cells.append((c, _pair_label(a, b), res["term"]))
    if not shipped and not cells:
        return []
    lines = [f"## {s.title or 'What the vendors 5x requires'}", "",
             f"The vendors' \"up to {claim}\" against each split/wafer ratio of tokens/s per kW at equal "
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
                                                   f"{c['x']:g} {t.get('unit', '')}".rstrip() + f" ({T.x(c['ratio'])})"
                                                   for c, pair, t in down[:6]]) if down else "")
                     + ".")
        lines.append("")
    return lines


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
    if tr is None or tr["range"] is None or ratio is None:
        return {**item, "text": head + f" (range over the uncertain terms not run: {why})", "ratio": ratio,
                "range": None, "term": None, "flips": [], "verdict": None}
    lo, hi = min(tr["range"][0], ratio), max(tr["range"][1], ratio)
    word = _verdict_word(lo, hi)
    ms = tr["most_sensitive"]
    flips = [(t, v) for t in tr["terms"] for v in t["flips_at"]]
    text = head + f", {T.span([lo, hi])} over the uncertain terms' ranges" + \
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
    return {**item, "text": text, "ratio": ratio, "range": [lo, hi], "term": ms["key"] if ms else None,
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
        head = f"{_pair_label(r['a'], r['b'])} tokens/s per kW at equal interactivity, {r['workload']}: {T.x(r['ratio'])}"
        out.append(_verdict(head, r["ratio"], tr, why, {"a": r["a"], "b": r["b"], "workload": r["workload"],
                                                        "reading": "equal_interactivity"}))
    for s in sections:
        res = results.get(s.key)
        if res is not None and s.kind == "tornado" and res.get("reading") == "at_capacity":
            for a, b in res["pairs"]:
                tr = B.tornado_rows(res, a, b)
                metric = {"tokens_per_joule": "tokens/J", "usd_per_mtok": "$/Mtok"}.get(res["metric"], res["metric"])
                head = (f"{_pair_label(a, b)} {metric} at each one's capacity, {res['workload']}: "
                        f"{T.x(tr['baseline']['ratio'])}")
                out.append(_verdict(head, tr["baseline"]["ratio"], tr, "no ratio as shipped",
                                    {"a": a, "b": b, "workload": res["workload"], "reading": "at_capacity"}))
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
                     f"{T.x(r['low_ratio'])} to {T.x(r['high_ratio'])}"
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
        where = f"{who(x['a'])} on {x['workload']} ({T.x(x['ratio'])})"
        if needs:
            parts.append(f"{where} reaches it only with {T.listing(needs[:2])}")
        elif tr and tr["range"]:
            parts.append(f"{where} does not reach it within the ranges (at most {T.x(tr['range'][1])})")
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

    s1 = ("At equal interactivity with every uncertain term as shipped, GPU prefill + wafer decode gives "
          + T.listing([f"{T.x(x['ratio'])} ({who(x['a'])}, {x['workload']})" for x in v if x["ratio"]][:6])
          + " the wafer alone's tokens/s per kW.")
    labels = {t["key"]: t["label"] for s in sections if s.kind == "tornado" and results.get(s.key)
              for t in results[s.key]["terms"]}
    if ranged:
        lo = min(x["range"][0] for x in ranged)
        hi = max(x["range"][1] for x in ranged)
        terms = [x["term"] for x in ranged if x["term"]]
        top = max(set(terms), key=terms.count) if terms else None
        flips = [x for x in ranged if x["verdict"] == "undetermined"]
        s2 = (f"Over the uncertain terms' documented ranges that ratio spans {T.x(lo)} to {T.x(hi)}, most sensitive "
              f"to {labels.get(top, top)}" + (f", so the verdict is undetermined in {len(flips)} of {len(ranged)} "
                                              "readings" if flips else ""))
        cap = [x for x in every if x["reading"] == "at_capacity" and x["range"]]
        if cap:
            s2 += (f"; at each one's capacity the tokens/J ratio spans "
                   f"{T.span([min(x['range'][0] for x in cap), max(x['range'][1] for x in cap)])}")
        s2 += "."
    else:
        s2 = "The uncertain terms were not swept."
    s3 = _five_x_sentence(results, sections, v, who)
    return [" ".join(x for x in (s1, s2, s3) if x)]


__all__ = ["breakeven_map", "five_x", "interactivity", "kv_reuse", "settle", "tornado", "verdict_lines", "verdicts",
           "what_rack_says"]
