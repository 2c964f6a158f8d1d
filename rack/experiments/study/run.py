"""Run the study's experiments (the pages are written by `rack.experiments.study.output`).

    from rack.experiments.study.run import run_study
    from rack.experiments.study.output import write_study
    results = run_study(StudyConfig.full(), command="python scripts/study.py")
    write_study(results, "docs/findings.md")

`rack study` runs the sections of a study spec (`rack.experiments.study.sections.run_spec`);
`run_study` runs the fixed experiments of `EXPERIMENTS` (the benchmark of the study's
own cost, `rack.experiments.bench_study`, times them).
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from rack.experiments.study import experiments as E
from rack.experiments.study.config import A100, A100_PD, CONDITIONAL, GPU72, GPU_ONLY, GPU_PD, SPLIT, SPLIT72, WAFER, StudyConfig

#: Every shipped scenario the study can run (their provisioned figures go in study.json.gz).
ALL = (GPU_ONLY, GPU72, WAFER, SPLIT, SPLIT72, CONDITIONAL, GPU_PD, A100, A100_PD)

#: File name of the saved results beside the figures (gzip-compressed JSON).
STUDY_JSON = "study.json.gz"

#: (results key, experiment); `bandwidth` also reads the load sweep's capacities.
EXPERIMENTS = (("shipped", E.shipped), ("load", E.load), ("prompt", E.prompt_length),
               ("output", E.output_length), ("bandwidth", E.bandwidth), ("agentic", E.agentic),
               ("tpot", E.tpot_slo), ("gpu_pd", E.gpu_disaggregation))


def deployments(names) -> dict:
    """{name: {"description", "model", "slo", "pools": {pool: {device, kind, role, devices}},
    "peak_w", "usd_per_hour", "energy_boundary"}} of shipped scenarios (no run: their provisioned figures)."""
    from devices.catalog import resolve_device
    from rack.experiments.compare import provisioned
    from rack.wiring.load import load_scenario

    out = {}
    for n in dict.fromkeys(names):
        s = load_scenario(n)
        prov = provisioned(s)
        out[n] = {"description": s.description, "model": s.model, "slo": s.slo.model_dump(),
                  "peak_w": prov["peak_w"], "usd_per_hour": prov["usd_per_hour"],
                  "energy_boundary": s.energy.boundary,
                  "pools": {p.name: {"device": prov["pools"][p.name]["device"], "role": p.role,
                                     "kind": resolve_device(p.device).kind,
                                     "devices": prov["pools"][p.name]["devices"]} for p in s.pools}}
    return out


def _git_commit() -> str:
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        code = [f":(top){d}" for d in ("rack", "devices", "interconnect", "workloads", "scripts", "pyproject.toml")]
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *code], cwd=here,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        return rev + (" with uncommitted changes to the code" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def command_line(argv: Optional[list] = None) -> str:
    """How this process was started, as a user would type it."""
    argv = list(sys.argv if argv is None else argv)
    prog = f"python {argv[0]}" if argv[0].endswith(".py") else Path(argv[0]).name
    return " ".join([prog, *argv[1:]])


def json_path_of(value, path: str = "") -> Optional[str]:
    """Where in `value` (dicts, lists) the first value JSON cannot hold sits, or None."""
    if isinstance(value, dict):
        for k, v in value.items():
            found = json_path_of(v, f"{path}.{k}")
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = json_path_of(v, f"{path}[{i}]")
            if found:
                return found
        return None
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return f"{path} ({type(value).__name__})"
    return None


def _checkpoint(folder: Optional[Path], key: str, cfg: StudyConfig):
    """(path of experiment `key`'s checkpoint, its saved result if it was made with the
    same configuration, else None)."""
    if folder is None:
        return None, None
    path = folder / f"{key}.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("config") == json.loads(json.dumps(cfg.as_dict())):
            return path, saved["result"]
    return path, None


def run_study(cfg: StudyConfig, *, command: str, log: Callable[[str], None] = lambda m: None,
              checkpoints: Optional[Path | str] = None, address: Optional[str] = None) -> dict:
    """Every experiment of `cfg`; returns the results (JSON-ready) with "meta" (command,
    date, version, git commit, wall time, trace hashes), "config", "deployments" and
    one key per experiment.

    checkpoints: a folder where each experiment's result is saved as it finishes
    (<key>.json, with the configuration); an experiment whose checkpoint was made with
    the same configuration is read back instead of run again (an interrupted study
    resumes).
    address: a Ray cluster ("auto", "HOST:PORT", "local"): every sweep's runs are Ray
    tasks there (`rack.runtime.run_pool.shared`); None: `cfg.workers` local processes,
    kept open for the whole study. The numbers do not depend on where runs execute.
    Raises TypeError naming the value if a result cannot be saved as JSON.
    """
    from rack.runtime import run_pool

    with run_pool.shared(cfg.workers, address):
        return _run_study(cfg, command=command, log=log, checkpoints=checkpoints)


def _run_study(cfg: StudyConfig, *, command: str, log: Callable[[str], None],
               checkpoints: Optional[Path | str]) -> dict:
    from rack import __version__
    from rack.measure.results import to_json

    t0 = time.perf_counter()
    commit = _git_commit()      # the code as the run starts (the tree may change while it runs)
    folder = Path(checkpoints) if checkpoints is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    results: dict = {"config": cfg.as_dict(), "timings_s": {}}
    for key, fn in EXPERIMENTS:
        t = time.perf_counter()
        path, saved = _checkpoint(folder, key, cfg)
        if saved is not None:
            results[key] = saved
            log(f"{key}: read back from {path}")
            continue
        results[key] = fn(cfg, log, results["load"]) if key == "bandwidth" else fn(cfg, log)
        results["timings_s"][key] = time.perf_counter() - t
        bad = json_path_of(results[key], key)
        if bad:
            raise TypeError(f"study result {bad} cannot be written as JSON")
        if path is not None:
            path.write_text(to_json({"config": cfg.as_dict(), "result": results[key]}))
        log(f"{key}: done in {results['timings_s'][key]:.0f} s")
    results["deployments"] = deployments([*cfg.shipped, *cfg.main, *ALL])
    results["meta"] = {"command": command, "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                       "version": __version__, "commit": commit, "python": platform.python_version(),
                       "platform": platform.platform(), "wall_s": time.perf_counter() - t0,
                       "traces": E.provenance(cfg)}
    return results


__all__ = ["ALL", "EXPERIMENTS", "STUDY_JSON", "command_line", "deployments", "run_study"]
