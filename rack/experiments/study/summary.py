"""README's "what rack says": the study's short answer (three sentences or fewer,
`rack.experiments.study.findings_terms.what_rack_says`) written between two markers, so
`rack study --readme README.md` regenerates it from the run."""

from __future__ import annotations

from pathlib import Path

BEGIN = "<!-- rack-says:begin (rack study --readme README.md writes this; do not edit) -->"
END = "<!-- rack-says:end -->"


def summary_text(results: dict) -> str:
    """The short answer of a study's results ("" when it has no interactivity section)."""
    from rack.experiments.study.findings_terms import what_rack_says
    from rack.experiments.study.layout import sections_of

    says = what_rack_says(results, sections_of(results))
    return says[0] if says else ""


def update_readme(path: Path | str, results: dict) -> str:
    """Replace the text between BEGIN and END in `path` with the study's short answer
    (and where it comes from); returns the new text. Raises ValueError naming the file
    when the markers are missing or the study has no answer to give."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{path}: no \"what rack says\" markers ({BEGIN!r} then {END!r})")
    body = summary_text(results)
    if not body:
        raise ValueError(f"{path}: the study has no interactivity verdicts to summarise")
    m = results["meta"]
    new = (f"{BEGIN}\n{body} (`{m['command']}`, {m['date']}, git {m['commit']}; details in docs/findings.md.)\n")
    out = text[:text.index(BEGIN)] + new + text[text.index(END):]
    path.write_text(out, encoding="utf-8")
    return out


__all__ = ["BEGIN", "END", "summary_text", "update_readme"]
