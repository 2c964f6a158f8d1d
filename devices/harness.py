"""How the benchmark behind a measured serving row ran it (devices/catalog/serving-harness.toml).

A serving row (`devices.serving_rows.ServingRow`) states the hardware, stack, lengths
and concurrency; the launch script that measured it also fixed things the row does not
say and that change what was measured: how many prompts each closed-loop user sends,
the scheduler's receive interval, the chunked-prefill budget, the running-request cap,
the speculative-decoding configuration. Those facts live in the harness file, each with
its source, and `harness_for(row)` gathers the ones that apply to a row (by its fields
and date, never by its id), so a row nobody has seen yet gets the harness of the script
and date it came from.

File layout: `[[harness]]` entries with `name`, `source`, a `match` table (row fields;
a list matches any of its values; `from` / `until`: ISO dates bounding the row's date,
inclusive) and any of the settings of `RowHarness`. Entries that match apply in file
order, a later one overriding the settings it gives.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .catalog import CatalogError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

#: The harness file shipped with the catalog.
HARNESS_FILE = Path(__file__).resolve().parent / "catalog" / "serving-harness.toml"
#: requests_per_user when no entry gives it: InferenceX's --num-prompts $((CONC * 10))
#: (see the harness file's first entry).
DEFAULT_REQUESTS_PER_USER = 10
_SETTINGS = ("requests_per_user", "scheduler_recv_interval", "chunk_tokens", "max_num_seqs", "speculative",
             "attention_dp_timeout_iters", "kv_cache_free_memory_fraction")


@dataclass(frozen=True)
class RowHarness:
    """The launch facts of one row.

    Attributes:
        requests_per_user: prompts each closed-loop user sends (>= 1).
        scheduler_recv_interval: {concurrency threshold: decode steps between the
            scheduler's receives} (SGLang --scheduler-recv-interval); see `recv_interval`.
        chunk_tokens: chunked-prefill tokens per iteration, or None (the pool's default).
        max_num_seqs: requests an instance runs at once, or None (the stack's default).
        speculative: {"draft_tokens", "acceptance_rate"} for a speculative row, or None.
        attention_dp_timeout_iters: TensorRT-LLM's attention-DP balance
            (`attention_dp_config: enable_balance, timeout_iters`): a colocated
            instance with data-parallel attention holds new prompts until every
            attention rank has one or this many iterations have passed; None: off.
        kv_cache_free_memory_fraction: TensorRT-LLM's `kv_cache_config.
            free_gpu_memory_fraction`: the KV cache takes this share of the memory left
            after the weights and the profiling forward (`devices.planner.plan_memory`
            `free_fraction`); None: the stack's activation reserve sizes it.
        sources: where each applied entry's facts come from.
    """

    requests_per_user: int = DEFAULT_REQUESTS_PER_USER
    scheduler_recv_interval: dict[int, int] = dataclasses.field(default_factory=lambda: {1: 1})
    chunk_tokens: int | None = None
    max_num_seqs: int | None = None
    speculative: dict | None = None
    attention_dp_timeout_iters: int | None = None
    kv_cache_free_memory_fraction: float | None = None
    sources: tuple[str, ...] = ()

    def recv_interval(self, concurrency: int) -> int:
        """The receive interval at `concurrency` users: the value of the largest
        threshold <= concurrency (1 below every threshold)."""
        below = [c for c in self.scheduler_recv_interval if c <= concurrency]
        return self.scheduler_recv_interval[max(below)] if below else 1


def _positive_int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise CatalogError(f"{where}: expected a positive integer, got {v!r}")
    return v


def _setting(key: str, v: Any, where: str) -> Any:
    where = f"{where}.{key}"
    if key == "scheduler_recv_interval":
        if not isinstance(v, dict) or not v:
            raise CatalogError(f"{where}: expected a table {{concurrency = interval}}, got {v!r}")
        out = {}
        for c, n in v.items():
            try:
                conc = int(c)
            except ValueError:
                raise CatalogError(f"{where}: key {c!r} is not a concurrency (integer)") from None
            out[_positive_int(conc, where)] = _positive_int(n, f"{where}.{c}")
        return out
    if key == "speculative":
        if not isinstance(v, dict) or set(v) != {"draft_tokens", "acceptance_rate"}:
            raise CatalogError(f"{where}: expected {{draft_tokens, acceptance_rate}}, got {v!r}")
        a = v["acceptance_rate"]
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= a < 1.0:
            raise CatalogError(f"{where}.acceptance_rate: expected a number in [0, 1), got {a!r}")
        return {"draft_tokens": _positive_int(v["draft_tokens"], f"{where}.draft_tokens"),
                "acceptance_rate": float(a)}
    if key == "kv_cache_free_memory_fraction":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < v <= 1.0:
            raise CatalogError(f"{where}: expected a number in (0, 1], got {v!r}")
        return float(v)
    return _positive_int(v, where)


@functools.lru_cache(maxsize=8)
def load_harness(path: str | Path = HARNESS_FILE) -> tuple[dict, ...]:
    """The harness entries of `path`, checked: ({"name", "source", "match", "settings"}, ...).

    Raises:
        CatalogError: unreadable file, bad TOML, or an entry with an unknown key or a
            setting of the wrong type (named). (A match field rows do not have is named
            by `harness_for`, which sees the rows.)
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise CatalogError(f"{path}: cannot read the serving harness: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"{path}: not valid TOML: {e}") from None
    entries = []
    for i, raw in enumerate(data.get("harness", [])):
        where = f"{path}: harness[{i}]"
        unknown = set(raw) - {"name", "source", "match", *_SETTINGS}
        if unknown:
            raise CatalogError(f"{where}: unknown keys {sorted(unknown)} (known: name, source, match, "
                               f"{', '.join(_SETTINGS)})")
        if not raw.get("source"):
            raise CatalogError(f"{where}: needs a source")
        match = raw.get("match", {})
        if not isinstance(match, dict):
            raise CatalogError(f"{where}.match: expected a table of row fields, got {match!r}")
        settings = {k: _setting(k, raw[k], where) for k in _SETTINGS if k in raw}
        entries.append({"name": raw.get("name", f"harness[{i}]"), "source": raw["source"], "match": match,
                        "settings": settings, "where": where})
    return tuple(entries)


def _matches(match: dict, row: Any, where: str) -> bool:
    bad = sorted(k for k in match if k not in ("from", "until") and not hasattr(row, k))
    if bad:
        raise CatalogError(f"{where}.match: {bad} are not serving-row fields")
    for key, want in match.items():
        if key == "from":
            if not row.date or row.date < str(want):
                return False
        elif key == "until":
            if not row.date or row.date > str(want):
                return False
        else:
            have = getattr(row, key)
            if have not in (want if isinstance(want, list) else [want]):
                return False
    return True


def harness_for(row: Any, path: str | Path = HARNESS_FILE) -> RowHarness:
    """The harness facts that apply to `row` (a ServingRow), later entries overriding
    earlier ones. Raises CatalogError on a bad harness file or a match field rows do
    not have (named)."""
    values: dict = {}
    sources: list[str] = []
    for e in load_harness(path):
        if _matches(e["match"], row, e["where"]):
            values.update(e["settings"])
            sources.append(e["source"])
    return RowHarness(**values, sources=tuple(sources))


__all__ = ["DEFAULT_REQUESTS_PER_USER", "HARNESS_FILE", "RowHarness", "harness_for", "load_harness"]
