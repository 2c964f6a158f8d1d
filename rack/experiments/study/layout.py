"""Which sections a saved study has and how each is drawn: the spec it was run with
(results["spec"]; results saved before study specs existed are drawn with the shipped
spec's order), and the view of the results a section's renderer reads (the section's
result under the key the first study used for its role, and its own StudyConfig)."""

from __future__ import annotations

from rack.experiments.study.spec import Section, StudySpec, load_spec

#: The results key the first study gave each role (the renderers of those roles read it).
CANONICAL = {"compare": "shipped", "load": "load", "prompt": "prompt", "output": "output",
             "bandwidth": "bandwidth", "agentic": "agentic", "tpot": "tpot", "gpu_pd": "gpu_pd"}


def sections_of(results: dict) -> list[Section]:
    """The spec sections of a saved study, in page order."""
    spec = results.get("spec")
    if spec is None:
        return list(load_spec(check_deployments=False).section)
    return list(StudySpec.model_validate(spec).section)


def view(results: dict, section: Section) -> dict:
    """`results` as a renderer of the section's role reads it."""
    from rack.experiments.study.sections import role

    r = role(section)
    out = dict(results)
    if r in CANONICAL and section.key in results:
        out[CANONICAL[r]] = results[section.key]
    cfg = results.get("section_config", {}).get(section.key)
    if cfg is not None:
        out["config"] = {**results["config"], **cfg}
    return out


__all__ = ["CANONICAL", "sections_of", "view"]
