"""Leave-one-device-out validation of borrowed stacks (`devices.borrow`): how far off a
device's measured serving rows come out when it runs the stack it would borrow were its
own entry missing. The median error is the borrowed stack's uncertainty; `rack validate`
prints the table.

The table over the shipped measured rows (gpu-calibration.csv and the InferenceX rows,
devices/catalog/inferencex/measured_rows.csv) is kept as data in `LODO_FILE`, written by
`scripts/fit_gpu_stacks.py --write` after the stacks are fitted, so that the uncertain
terms of `rack study` (devices.uncertainty: the MI455X's borrowed-stack time factor)
read it without re-running the fit:

- `borrowed_stack_uncertainty(device)`: {"factor", "median_abs_error", "rows",
  "devices", "source"} for a device's borrowed stack (the device's own leave-one-out
  figures when it has rows, else the median over every device: the MI455X has none);
- `power_fractions(entry)`: a fitted stack's idle and busy board power as fractions of
  its hardware's TDP, the basis of a device's power range when it borrows that stack.
"""

from __future__ import annotations

import functools
import math
import sys

import numpy as np

from .borrow import borrowed_spec, nearest_calibrated
from .catalog import CATALOG_DIR, CatalogError, _lookup_key, _root, get_device
from .serving_rows import closed_loop_estimate, deployment, load_serving_rows, measured

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

#: The leave-one-device-out table over the shipped rows (written by the fit script).
LODO_FILE = CATALOG_DIR / "lodo.toml"
METRICS = ("tpot_s", "ttft_s", "throughput_per_gpu")


def leave_one_device_out(rows=None) -> dict:
    """Leave-one-device-out validation of borrowing, on the measured serving rows.

    For each device with rows, every row is predicted (`closed_loop_estimate`) with
    the stack that device would borrow were its own entries missing (the nearest
    calibrated entry of the same family on other hardware), against the measurement.
    Returns {"devices": [{"device", "stack", "borrowed_from", "rows", "median_abs_error":
    {metric: e}, "median_abs_log_error": {metric: |ln(pred / meas)|}}], "median_abs_error":
    {metric: e} over every row, "median_abs_log_error": {metric: e}, "rows": n}.
    """
    rows = rows if rows is not None else load_serving_rows(CATALOG_DIR / "gpu-calibration.csv")
    groups: dict[tuple[str, str], list] = {}
    for r in rows:
        dep = deployment(r)
        groups.setdefault((dep.device, dep.stack), []).append((r, dep))
    out, every, every_log = [], {m: [] for m in METRICS}, {m: [] for m in METRICS}
    for (dev, stk), items in sorted(groups.items()):
        root = _root(_lookup_key("devices", dev))
        try:
            lender = nearest_calibrated(dev, stk, exclude=(root,))
        except CatalogError:
            continue
        spec = borrowed_spec(dev, lender, stk)
        errs, logs = {m: [] for m in METRICS}, {m: [] for m in METRICS}
        for r, dep in items:
            est, meas = closed_loop_estimate(dep, spec), measured(r)
            for m in METRICS:
                errs[m].append(abs(est[m] / meas[m] - 1.0))
                logs[m].append(abs(math.log(est[m] / meas[m])))
                every[m].append(errs[m][-1])
                every_log[m].append(logs[m][-1])
        out.append({"device": dev, "stack": stk, "borrowed_from": lender, "rows": [r.id for r, _ in items],
                    "median_abs_error": {m: float(np.median(v)) for m, v in errs.items()},
                    "median_abs_log_error": {m: float(np.median(v)) for m, v in logs.items()}})
    return {"devices": out, "median_abs_error": {m: float(np.median(v)) for m, v in every.items() if v},
            "median_abs_log_error": {m: float(np.median(v)) for m, v in every_log.items() if v},
            "rows": sum(len(d["rows"]) for d in out)}


def write_lodo(lodo: dict, source: str, power: dict | None = None, path=LODO_FILE) -> None:
    """Write a `leave_one_device_out` result as `LODO_FILE`'s TOML (per device and the
    overall medians; `source` says which rows), and `power`: {entry: {"idle_fraction_low",
    "idle_fraction_high", "rows"}} (idle / busy power over leave-one-row-out refits)."""
    lines = ["# Leave-one-device-out validation of borrowed stacks (devices/lodo.py), written by",
             "# scripts/fit_gpu_stacks.py --write: each device's measured rows predicted with the stack it",
             "# would borrow were its own entry missing. median_abs_log_error: median |ln(pred / meas)|.",
             f'source = "{source}"', f"rows = {lodo['rows']}", "",
             "[all.median_abs_error]", *(f"{m} = {v:.4f}" for m, v in lodo["median_abs_error"].items()),
             "[all.median_abs_log_error]", *(f"{m} = {v:.4f}" for m, v in lodo["median_abs_log_error"].items())]
    for d in lodo["devices"]:
        key = f'"{d["device"]}-{d["stack"]}"'
        lines += ["", f"[device.{key}]", f'device = "{d["device"]}"', f'stack = "{d["stack"]}"',
                  f'borrowed_from = "{d["borrowed_from"]}"', f"rows = {len(d['rows'])}",
                  f"[device.{key}.median_abs_error]", *(f"{m} = {v:.4f}" for m, v in d["median_abs_error"].items()),
                  f"[device.{key}.median_abs_log_error]",
                  *(f"{m} = {v:.4f}" for m, v in d["median_abs_log_error"].items())]
    for entry, p in (power or {}).items():
        lines += ["", f'[power."{entry}"]', *(f"{k} = {v:.4g}" for k, v in p.items())]
    path.write_text("\n".join(lines) + "\n")
    _lodo_table.cache_clear()


@functools.lru_cache(maxsize=1)
def _lodo_table() -> dict:
    try:
        return tomllib.loads(LODO_FILE.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise CatalogError(f"{LODO_FILE}: cannot read the leave-one-device-out table: {e}") from None


def borrowed_stack_uncertainty(device: str | None = None, stack: str = "sglang") -> dict:
    """How far a borrowed stack's predictions are off, from `LODO_FILE`.

    device: a catalog device; when the table has its rows for `stack` (family key),
    its own figures, else (None, or a device with no measured row such as the MI455X)
    the medians over every device. Returns {"factor": exp(median |ln error|) of step
    time (the larger of TPOT's and throughput per GPU's: a borrowed stack's step time
    is off by / factor to x factor), "median_abs_error": {metric: e},
    "median_abs_log_error": {metric: e}, "rows": n, "devices": n, "scope": "device" |
    "all", "source": str}.

    Raises:
        CatalogError: the table is missing or unreadable.
    """
    tab = _lodo_table()
    entry, scope = None, "all"
    if device is not None:
        root = _root(_lookup_key("devices", device))
        for d in tab.get("device", {}).values():
            if _root(_lookup_key("devices", d["device"])) == root and d["stack"] == stack:
                entry, scope = d, "device"
    src = entry if entry is not None else tab["all"]
    logs = src["median_abs_log_error"]
    return {"factor": math.exp(max(logs["tpot_s"], logs["throughput_per_gpu"])),
            "median_abs_error": dict(src["median_abs_error"]), "median_abs_log_error": dict(logs),
            "rows": entry["rows"] if entry is not None else tab["rows"],
            "devices": 1 if entry is not None else len(tab.get("device", {})), "scope": scope,
            "source": tab.get("source", "")}


def hardware_tdp_w(entry: str) -> float:
    """The board power limit (W) of a catalog entry's hardware: `peak_w` of its hardware
    entry (the "roofline" stack), which a stack's fitted `peak_w` does not change."""
    root = _root(_lookup_key("devices", entry))
    try:
        return get_device(root, "roofline").peak_w
    except CatalogError:          # a hardware file without a roofline stack: its default
        return get_device(root).peak_w


def power_fractions(entry: str) -> dict:
    """A stack entry's board power as fractions of its hardware's TDP: {"idle",
    "busy", "tdp_w", "entry"} (idle_w / TDP, peak_w / TDP; TDP = the hardware entry's
    peak_w, catalog key "<hw>-<stack>"). The fitted values are the entry's own when
    scripts/fit_gpu_stacks.py fitted them on rows with measured power."""
    spec = get_device(entry)
    tdp = hardware_tdp_w(entry)
    return {"idle": spec.idle_w / tdp, "busy": spec.peak_w / tdp, "tdp_w": tdp, "entry": entry}


def power_fraction_range(entry: str) -> tuple[float, float]:
    """(low, high) of a fitted stack's idle power / busy power over the fits that leave
    out one of its rows with measured power (`LODO_FILE`'s [power] table).

    Raises:
        CatalogError: the entry's power was not fitted (no [power] table for it)."""
    p = _lodo_table().get("power", {}).get(entry)
    if p is None:
        raise CatalogError(f"{LODO_FILE}: no fitted power for {entry!r} (scripts/fit_gpu_stacks.py --write)")
    return float(p["idle_fraction_low"]), float(p["idle_fraction_high"])


__all__ = ["LODO_FILE", "hardware_tdp_w", "power_fraction_range", "borrowed_stack_uncertainty", "leave_one_device_out", "power_fractions", "write_lodo"]
