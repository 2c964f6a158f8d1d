"""One-page reports (Markdown, and HTML rendered from it with markdown-it-py, a
dependency of rich) for `rack compare` and `rack sweep`.

Every number in a report is computed from the runs it describes; nothing is typed in.
Images are referenced by paths relative to the report, so the folder can be moved.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from rack.measure.breakdown import stage_order
from rack.measure.results import fmt_s

_CSS = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.45}"
        "table{border-collapse:collapse;font-size:0.85em;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:3px 6px;text-align:right}td:first-child,th:first-child{text-align:left}"
        "img{max-width:100%}code{background:#f4f4f4;padding:0 3px}")

METRIC_DEFINITIONS = [
    "TTFT: arrival to the moment the client receives the first output token, queueing included: the end of "
    "the prompt's last prefill chunk when colocated; in a split deployment the end of the decode engine's "
    "first step after the KV has landed (first_token = \"decode\", the default), so it includes the KV "
    "transfer and its waits. TPOT: (E2E - TTFT) / (output tokens - 1), requests with >= 2 output tokens. "
    "ITL: every gap between consecutive output tokens the client receives. E2E: arrival to last token.",
    "Goodput: completed requests per second meeting both the TTFT and the TPOT target, over the requests "
    "that arrived in the steady-state window (the arrival span less its first and last 10%: warm-up and "
    "drain), beside the offered rate measured the same way; SLO attainment: requests meeting both targets "
    "over all submitted requests (DistServe). Rejected and failed requests count against both.",
    "Percentiles: linear interpolation between closest ranks (numpy's default).",
    "Tokens per joule: completed output tokens / device energy over the run; $/M tokens: the run's cost / "
    "completed output tokens x 1e6 (rack.measure.energy documents both models and their sources).",
]


def to_html(markdown_text: str, title: str) -> str:
    """A standalone HTML page from Markdown (CommonMark + tables)."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown_text)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>{body}</body></html>\n")


def md_table(heads: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(heads) + " |", "|---|" + "---:|" * (len(heads) - 1)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _ratio(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def breakdown_table(breakdowns: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown table: one row per stage, "mean / p99" per scenario."""
    labels = list(breakdowns)
    stages = stage_order(breakdowns)
    rows = []
    for st in stages:
        cells = [st]
        for l in labels:
            r = next((x for x in breakdowns[l]["stages"] if x["stage"] == st), None)
            cells.append("-" if r is None else "0" if r["mean_s"] == 0 and r["p99_s"] == 0 else
                         f"{fmt_s(r['mean_s'])} / {fmt_s(r['p99_s'])}")
        rows.append(cells)
    rows.append(["**E2E (mean)**"] + [f"**{fmt_s(breakdowns[l]['e2e_mean_s'])}**" for l in labels])
    return md_table(["stage (mean / p99)"] + labels, rows)


def compare_markdown_report(doc: Mapping[str, Any], table_md: str, plots: Mapping[str, str],
                            breakdowns: Mapping[str, Mapping[str, Any]], files: Mapping[str, str]) -> str:
    """The comparison report.

    doc: `rack.experiments.compare.compare_document` output; table_md: the side-by-side table;
    plots: caption -> relative PNG path; breakdowns: scenario -> stage breakdown;
    files: description -> relative path of the other outputs.
    """
    sc = doc["scenarios"]
    first = sc[0]
    trace = doc.get("trace") or {}
    prov = first["provenance"]
    iso = doc["iso"]
    lines = ["# Split versus colocated", ""]
    lines.append(f"{len(sc)} deployments on the same {first['requests']['submitted']} requests "
                 f"({trace.get('path', 'requests given in code')}"
                 + (f", sha256 {trace['sha256'][:12]}" if trace.get("sha256") else "") + "), "
                 f"{prov['runtime']} runtime, rack {prov['version']}; "
                 + ("each deployment as configured." if iso == "none" else
                    f"iso-{iso}: instance counts rescaled to the reference {doc['reference']!r} "
                    "(rack.experiments.compare documents the rounding)."))
    lines.append("")
    for s in sc:
        d = s["provenance"]["config"].get("description") or ""
        lines.append(f"- **{s['name']}**: {d}")
    for w in doc.get("warnings") or []:
        lines += ["", f"**Warning**: {w}"]
    lines += ["", "## Side by side", "", table_md, ""]

    vc = doc.get("vendor_claim") or {}
    lines += ["## Tokens per joule: GPU prefill + wafer decode versus the wafer alone", ""]
    if vc.get("ratio") is not None:
        tpj = vc["tokens_per_joule"]
        lines.append(f"Measured on this trace: **{vc['split']}** delivers {tpj[vc['split']]:.4g} output tokens/J, "
                     f"**{vc['wafer_only']}** {tpj[vc['wafer_only']]:.4g}: a ratio of **{_ratio(vc['ratio'])}** "
                     f"(busy-time power model; {_ratio(vc['ratio_by_activity'].get('roofline'))} with the "
                     f"roofline-activity model). The vendors' claim is \"{vc['claim']}\".")
        lines += ["", "Assumptions behind the measured ratio:", ""]
        lines += [f"- {a}" for a in vc.get("assumptions", [])]
    else:
        lines.append(f"Not measured here: {vc.get('missing', 'the comparison lacks one of the two deployments')}. "
                     "Include a GPU-prefill + wafer-decode scenario and a wafer-only one (the default "
                     "`rack compare` does).")
    energy = first["energy"]
    # The window line differs per run; every run's window is in compare.json (energy.window_s).
    model = [a for a in energy["assumptions"] if not a.startswith("integrated over")]
    lines += ["", "Energy model: " + "; ".join(model) + "; integrated from 0 to each run's last request event, "
              "over every provisioned device, busy or idle.", ""]
    lines.append("Prices: " + "; ".join(sorted({f"{p['device']}: ${p['usd_per_device_hour']:.2f}/h ({p['price_source']})"
                                                if p["usd_per_device_hour"] is not None else
                                                f"{p['device']}: {p['price_source']}"
                                                for s in sc for p in s["cost"]["pools"].values()}))
                 + ". Cost: " + "; ".join(a for a in first["cost"]["assumptions"] if not a.startswith("the run's cost"))
                 + "; divided by each run's completed output tokens.")
    lines += ["", "## Where the time goes", "",
              "Mean and p99 time per request in each stage of the token's path (completed requests; "
              "rack.measure.breakdown defines the stages; p99s do not add up).", "",
              breakdown_table(breakdowns), ""]
    for caption, rel in plots.items():
        lines += [f"### {caption}", "", f"![{caption}]({rel})", ""]
    lines += ["## Definitions", ""] + [f"- {d}" for d in METRIC_DEFINITIONS] + [""]
    if files:
        lines += ["## Files", ""] + [f"- {k}: `{v}`" for k, v in files.items()] + [""]
    return "\n".join(lines)


def sweep_markdown_report(sweep: Mapping[str, Any], table_md: str, plots: Mapping[str, str],
                          summary_lines: Sequence[str]) -> str:
    """The sweep report: what was swept, the summary (max rates, crossovers), the points
    table and the plots."""
    lines = [f"# Sweep: {sweep['kind']}", "", f"Workload: {sweep['workload']}.", ""]
    lines += ["## Summary", ""] + [f"- {s}" for s in summary_lines] + [""]
    lines += ["## Points", "", table_md, ""]
    for caption, rel in plots.items():
        lines += [f"### {caption}", "", f"![{caption}]({rel})", ""]
    lines += ["## Definitions", ""] + [f"- {d}" for d in METRIC_DEFINITIONS]
    lines.append("- Maximum sustainable rate: the highest swept rate whose SLO attainment meets the target, "
                 "scanning up to the first miss: a measured point, never an interpolation (DistServe's goodput).")
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path | str, markdown_text: str, title: str, stem: str = "report") -> tuple[Path, Path]:
    """Write `<stem>.md` and `<stem>.html` into `out_dir`; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{stem}.md"
    md.write_text(markdown_text)
    page = out / f"{stem}.html"
    page.write_text(to_html(markdown_text, title))
    return md, page


__all__ = ["METRIC_DEFINITIONS", "breakdown_table", "md_table", "compare_markdown_report", "sweep_markdown_report",
           "to_html", "write_report"]
