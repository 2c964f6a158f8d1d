"""Leave-one-device-out validation of borrowed stacks (`devices.borrow`): how far off a
device's measured serving rows come out when it runs the stack it would borrow were its
own entry missing. The median error is the borrowed stack's uncertainty; `rack validate`
prints the table."""

from __future__ import annotations

import numpy as np

from .borrow import borrowed_spec, nearest_calibrated
from .catalog import CATALOG_DIR, CatalogError, _lookup_key, _root
from .serving_rows import closed_loop_estimate, deployment, load_serving_rows, measured


def leave_one_device_out(rows=None) -> dict:
    """Leave-one-device-out validation of borrowing, on the measured serving rows.

    For each device with rows, every row is predicted (`closed_loop_estimate`) with
    the stack that device would borrow were its own entries missing (the nearest
    calibrated entry of the same family on other hardware), against the measurement.
    Returns {"devices": [{"device", "stack", "borrowed_from", "rows", "median_abs_error":
    {metric: e}}], "median_abs_error": {metric: e} over every row, "rows": n}.
    """
    rows = rows if rows is not None else load_serving_rows(CATALOG_DIR / "gpu-calibration.csv")
    groups: dict[tuple[str, str], list] = {}
    for r in rows:
        dep = deployment(r)
        groups.setdefault((dep.device, dep.stack), []).append((r, dep))
    out, every = [], {"tpot_s": [], "ttft_s": [], "throughput_per_gpu": []}
    for (dev, stk), items in sorted(groups.items()):
        root = _root(_lookup_key("devices", dev))
        try:
            lender = nearest_calibrated(dev, stk, exclude=(root,))
        except CatalogError:
            continue
        spec = borrowed_spec(dev, lender, stk)
        errs = {m: [] for m in every}
        for r, dep in items:
            est, meas = closed_loop_estimate(dep, spec), measured(r)
            for m in errs:
                e = abs(est[m] / meas[m] - 1.0)
                errs[m].append(e)
                every[m].append(e)
        out.append({"device": dev, "stack": stk, "borrowed_from": lender, "rows": [r.id for r, _ in items],
                    "median_abs_error": {m: float(np.median(v)) for m, v in errs.items()}})
    return {"devices": out, "median_abs_error": {m: float(np.median(v)) for m, v in every.items() if v},
            "rows": sum(len(d["rows"]) for d in out)}


__all__ = ["leave_one_device_out"]
