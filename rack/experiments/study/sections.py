"""Run a study spec (`rack.experiments.study.spec`): each section's grid through the
experiment of its kind, checkpointed as it finishes, with the provenance of every
workload read.

Sections of the kinds docs/findings.md has had since the first study (compare,
capacity, bandwidth, gpu_pd) run through `rack.experiments.study.experiments` with a
`StudyConfig` built from the section's grid (`section_config`); the interactivity,
tornado and break-even sections through `rack.experiments.study.curves`.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from rack.experiments.study import experiments as E
from rack.experiments.study.config import StudyConfig
from rack.experiments.study.spec import Section, StudySpec, StudySpecError

Log = Callable[[str], None]


def role(section: Section) -> str:
    """Which experiment (and part of the page) a section is: "compare", "load" (a trace,
    no parameter), "agentic" (a workload file), "prompt" / "output" (a synthetic
    length axis), "tpot", "bandwidth", "gpu_pd", "interactivity", "tornado",
    "breakeven_map" or "view"."""
    if section.kind != "capacity":
        return section.kind
    p = section.parameter.name if section.parameter else None
    w = section.workloads[0]
    if p == "slo.tpot_ms":
        return "tpot"
    if p in ("prompt_tokens", "output_tokens"):
        return p.split("_")[0]
    return "agentic" if w.workload is not None else "load"


def section_config(section: Section, base: StudyConfig) -> StudyConfig:
    """The `StudyConfig` that runs a compare/capacity/bandwidth/gpu_pd section's grid
    (`base` gives workers, progress and the attainment target). Raises StudySpecError
    for a grid its experiment cannot run."""
    r = role(section)
    w = section.workloads[0] if section.workloads else None
    rates = section.rates.as_tuple() if section.rates else None
    cfg = replace(base, target=section.slo.target or base.target)
    if section.kind == "capacity" and (section.slo.ttft_ms or section.slo.tpot_ms):
        raise StudySpecError(f"section {section.key!r}: slo.ttft_ms/tpot_ms: a capacity section runs the "
                             "deployments' own SLO; sweep parameter 'slo.tpot_ms' to vary the TPOT target")
    need_trace = r in ("compare", "load", "tpot", "bandwidth")
    if need_trace and (w is None or w.trace is None):
        raise StudySpecError(f"section {section.key!r}: workloads[0]: a {r} section runs a trace")
    if r == "compare":
        return replace(cfg, shipped=tuple(section.deployments), excerpt=w.trace, excerpt_window=w.window)
    if r in ("load", "tpot", "bandwidth"):
        cfg = replace(cfg, trace=w.trace, window=tuple(w.window) if w.window else (0.0, 1e9))
    if r == "load":
        return replace(cfg, main=tuple(section.deployments), rate_scales=rates)
    if r == "tpot":
        return replace(cfg, tpot_scenarios=tuple(section.deployments), tpot_rate_scales=rates,
                       tpot_slos_ms=tuple(float(v) for v in section.parameter.values))
    if r == "agentic":
        return replace(cfg, main=tuple(section.deployments), agentic_workload=w.workload,
                       agentic_duration_s=w.duration_s or cfg.agentic_duration_s, agentic_rate_scales=rates)
    if r in ("prompt", "output"):
        s = w.synthetic
        other = "output_tokens" if r == "prompt" else "prompt_tokens"
        fixed = getattr(s, other)
        if fixed is None:
            raise StudySpecError(f"section {section.key!r}: workloads[0].synthetic.{other}: the length a "
                                 f"{r}-length axis keeps fixed")
        vals = tuple(int(v) for v in section.parameter.values)
        cfg = replace(cfg, main=tuple(section.deployments), synthetic_n=s.n, synthetic_duration_s=s.duration_s,
                      synthetic_rates=rates)
        return (replace(cfg, prompt_lengths=vals, prompt_output_tokens=fixed) if r == "prompt"
                else replace(cfg, output_lengths=vals, output_prompt_tokens=fixed))
    if r == "bandwidth":
        return replace(cfg, bandwidths=tuple(float(v) for v in section.parameter.values))
    return cfg


def _bandwidth(section: Section, cfg: StudyConfig, log: Log, results: dict) -> dict:
    cases, base_result = [], None
    for c in section.cases:
        if c.split is None or not c.against:
            raise StudySpecError(f"section {section.key!r}: a bandwidth case needs split and against")
        scale = c.rate_scale or 1.0
        if c.capacity_from:
            cap = results[c.capacity_from]
            base_result = cap
            got = cap["summary"]["max_rate_scale"].get(c.capacity_of or c.split)
            scale = got or scale
        cases.append((c.split, tuple(c.against), scale))
    if base_result is None:
        _, reqs = E._trace_workload(cfg.trace, cfg.window)
        base_result = {"base_rate": E._base_rate(reqs)}
    return E.bandwidth(cfg, log, base_result, cases=cases)


def _gpu_pd(section: Section, cfg: StudyConfig, log: Log) -> dict:
    out = []
    for i, c in enumerate(section.cases):
        if not (c.colocated and c.pd and c.ratios and c.tpot_ms and c.workload and c.workload.trace and c.rates):
            raise StudySpecError(f"section {section.key!r}: cases[{i}]: a gpu_pd case needs colocated, pd, "
                                 "ratios, tpot_ms, workload (a trace) and rates")
        w = c.workload
        out.append(E._pd_case(cfg, log, c.colocated, c.pd, [tuple(r) for r in c.ratios], c.tpot_ms, w.trace,
                              tuple(w.window) if w.window else (0.0, 1e9), c.rates.as_tuple()))
    return {"cases": out}


def run_section(section: Section, cfg: StudyConfig, log: Log, results: dict) -> Optional[dict]:
    """One section's result (JSON-ready), or None for a view (nothing runs)."""
    from rack.experiments.study import curves as C

    r = role(section)
    if r == "view":
        return None
    if r in ("interactivity", "tornado", "breakeven_map"):
        fn = {"interactivity": C.interactivity, "tornado": C.tornado, "breakeven_map": C.breakeven_map}[r]
        try:
            return fn(section, cfg, log)
        except ValueError as exc:
            raise StudySpecError(f"section {section.key!r}: {exc}") from None
    scfg = section_config(section, cfg)
    if r == "bandwidth":
        return _bandwidth(section, scfg, log, results)
    if r == "gpu_pd":
        return _gpu_pd(section, scfg, log)
    fn = {"compare": E.shipped, "load": E.load, "prompt": E.prompt_length, "output": E.output_length,
          "agentic": E.agentic, "tpot": E.tpot_slo}[r]
    return fn(scfg, log)


def provenance(spec: StudySpec) -> dict:
    """SHA-256 of every trace and workload file the spec's sections read
    ({name: {path, sha256}})."""
    from rack.run.runner import trace_info
    from workloads import resolve_trace
    from workloads.workload_spec import resolve_workload

    out = {}
    for s in spec.section:
        refs = list(s.workloads) + [c.workload for c in s.cases if c.workload is not None]
        for w in refs:
            if w.trace and w.trace not in out:
                out[w.trace] = resolve_trace(w.trace)
            elif w.workload and w.workload not in out:
                out[w.workload] = resolve_workload(w.workload)
    return {n: {"path": (info := trace_info(p))["path"], "sha256": info["sha256"]} for n, p in out.items()}


def _checkpoint(folder: Optional[Path], key: str, stamp: dict):
    if folder is None:
        return None, None
    path = folder / f"{key}.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("config") == json.loads(json.dumps(stamp)):
            return path, saved["result"]
    return path, None


def run_spec(spec: StudySpec, cfg: StudyConfig, *, command: str, log: Log = lambda m: None,
             checkpoints: Optional[Path | str] = None, spec_path: Optional[str] = None,
             address: Optional[str] = None) -> dict:
    """Every section of `spec` (already `.quick()`-ed for a smoke test); `cfg` gives
    workers, progress and quick_mode. Returns the results (JSON-ready): "spec" (the
    spec run), "config" (the StudyConfig of the sections of the first study's kinds,
    merged), "section_config" ({key: that section's}), one key per section that runs,
    "deployments", "meta" (command, date, version, git commit, wall time, traces).
    Checkpoints as `rack.experiments.study.run.run_study`'s (an interrupted study resumes).
    address: a Ray cluster ("auto", "HOST:PORT", "local"): every sweep's runs are Ray
    tasks there (`rack.runtime.run_pool.shared`); None: `cfg.workers` local processes,
    kept open for the whole study. The numbers do not depend on where runs execute.
    Raises StudySpecError for a section its experiment cannot run, TypeError for a
    result JSON cannot hold."""
    from rack.runtime import run_pool

    with run_pool.shared(cfg.workers, address):
        return _run_spec(spec, cfg, command=command, log=log, checkpoints=checkpoints, spec_path=spec_path)


def _run_spec(spec: StudySpec, cfg: StudyConfig, *, command: str, log: Log,
              checkpoints: Optional[Path | str], spec_path: Optional[str]) -> dict:
    from rack import __version__
    from rack.measure.results import to_json
    from rack.experiments.study.run import ALL, _git_commit, deployments, json_path_of

    t0 = time.perf_counter()
    commit = _git_commit()
    cfg = replace(cfg, target=spec.target)
    folder = Path(checkpoints) if checkpoints is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    merged = cfg
    section_cfgs = {}
    for s in spec.section:
        if s.kind in ("compare", "capacity", "bandwidth", "gpu_pd"):
            sc = section_config(s, cfg)
            section_cfgs[s.key] = sc.as_dict()
            changed = {k: v for k, v in sc.as_dict().items() if v != cfg.as_dict()[k]}
            merged = replace(merged, **{k: getattr(sc, k) for k in changed})
    try:        # every trace and workload file found (and hashed) before anything runs
        traces = provenance(spec)
    except (OSError, ValueError) as exc:
        raise StudySpecError(f"{spec_path or 'the shipped spec'}: {exc}") from None
    results: dict = {"spec": spec.model_dump(mode="json"), "config": merged.as_dict(), "section_config": section_cfgs,
                     "timings_s": {}}
    names: list[str] = []
    for s in spec.section:
        names += s.scenario_names()
        stamp = {"section": s.model_dump(mode="json"), "quick": cfg.quick_mode, "target": cfg.target}
        path, saved = _checkpoint(folder, s.key, stamp)
        if saved is not None:
            results[s.key] = saved
            log(f"{s.key}: read back from {path}")
            continue
        t = time.perf_counter()
        res = run_section(s, cfg, log, results)
        if res is None:
            continue
        results[s.key] = res
        results["timings_s"][s.key] = time.perf_counter() - t
        bad = json_path_of(res, s.key)
        if bad:
            raise TypeError(f"study result {bad} cannot be written as JSON")
        if path is not None:
            path.write_text(to_json({"config": stamp, "result": res}))
        log(f"{s.key}: done in {results['timings_s'][s.key]:.0f} s")
    shipped = spec_path is None
    results["deployments"] = deployments([*names, *(ALL if shipped else ())])
    results["meta"] = {"command": command, "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                       "version": __version__, "commit": commit, "python": platform.python_version(),
                       "platform": platform.platform(), "wall_s": time.perf_counter() - t0,
                       "traces": traces, "spec": spec_path or "rack/experiments/study/findings.toml"}
    return results


__all__ = ["provenance", "role", "run_section", "run_spec", "section_config"]
