"""Trace formats: which column holds what, in which unit, and how a format is detected.

Every supported format is a `Schema` (a column mapping plus units) read by one CSV
reader or one JSONL reader (`workloads.reader`). The built-in presets:

- ``mooncake``: JSONL, ``timestamp`` (ms from trace start), ``input_length``,
  ``output_length``, ``hash_ids`` (one hash per 512-token block). Source:
  kvcache-ai/Mooncake ``FAST25-release/traces/``.
- ``azure``: CSV, ``TIMESTAMP`` (date-time), ``ContextTokens``, ``GeneratedTokens``;
  the 2023 (Splitwise) and 2024 (DynamoLLM, zone suffix) layouts share the columns.
  Source: Azure/AzurePublicDataset.
- ``burstgpt``: CSV, ``Timestamp`` (s), ``Model``, ``Request tokens``,
  ``Response tokens``, ``Total tokens``, ``Log Type``; rows with 0 response tokens are
  failed requests (counted, not yielded). Model -> `Request.tenant`, Log Type ->
  `Request.slo_class`. Source: HPMLL/BurstGPT.
- ``vidur``: CSV length distribution without timestamps (``num_prefill_tokens``,
  ``num_decode_tokens``), e.g. microsoft/vidur's arXiv-summarization file.
- ``csv`` / ``jsonl``: generic, with a user mapping (see `Schema.from_mapping`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from .errors import TraceError
from .jsontext import MAX_ROW_DEPTH, brackets, json_depth
from .textfile import open_binary

#: Units of a numeric timestamp column, and how many of them make one second (exact
#: floats, so that millisecond timestamps divide exactly).
TIME_UNITS: dict[str, float] = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}
TIME_UNIT_WORDS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}

MAPPING_KEYS = (
    "timestamp", "prompt_tokens", "output_tokens", "block_hashes", "tenant", "slo_class",
    "time_unit", "block_size",
)


@dataclass(frozen=True)
class Schema:
    """How one trace format maps onto `Request`.

    name: format name (``"mooncake"``, ``"azure"``, ...).
    container: ``"csv"`` or ``"jsonl"``.
    timestamp: column/key of the arrival time, or None for a length-only source
      (then every request gets ``arrival_s = 0.0`` and `has_timestamps` is False).
    time_unit: ``"s"``, ``"ms"``, ``"us"``, ``"ns"`` (numbers) or ``"datetime"`` (text).
    prompt_tokens, output_tokens: columns of the lengths (tokens).
    block_hashes: column of the prefix-block hashes (JSON list, or in CSV a text like
      ``"[1, 2]"`` / ``"1 2"`` / ``"1;2"``), or None.
    block_size: tokens per hash block (Mooncake: 512, from its trace README).
    tenant, slo_class: optional label columns.
    zero_output_is_failure: a row with 0 output tokens is a failed request (BurstGPT),
      counted in `TraceReader.failed_requests` instead of being a bad row.
    """

    name: str
    container: str
    timestamp: str | None
    prompt_tokens: str
    output_tokens: str
    time_unit: str = "s"
    block_hashes: str | None = None
    block_size: int = 512
    tenant: str | None = None
    slo_class: str | None = None
    zero_output_is_failure: bool = False

    @property
    def has_timestamps(self) -> bool:
        return self.timestamp is not None

    def columns(self) -> list[str]:
        """Every column this schema reads (required and optional)."""
        cols = [self.timestamp, self.prompt_tokens, self.output_tokens, self.block_hashes,
                self.tenant, self.slo_class]
        return [c for c in cols if c is not None]

    def with_mapping(self, mapping: Mapping[str, Any], name: str | None = None) -> "Schema":
        """This schema with some columns/units replaced by `mapping` (see `from_mapping`)."""
        unknown = set(mapping) - set(MAPPING_KEYS) - {"arrival_s"}
        if unknown:
            raise ValueError(
                f"unknown mapping key(s) {sorted(unknown)}; allowed: {', '.join(MAPPING_KEYS)}"
            )
        changes: dict[str, Any] = {}
        for key, value in mapping.items():
            key = "timestamp" if key == "arrival_s" else key
            if key == "block_size":
                value = int(value)
                if value < 1:
                    raise ValueError(f"mapping block_size must be >= 1, got {value}")
            elif key == "time_unit":
                if value not in TIME_UNITS and value != "datetime":
                    raise ValueError(
                        f"mapping time_unit must be one of {[*TIME_UNITS, 'datetime']}, got {value!r}"
                    )
            elif value is not None and not isinstance(value, str):
                raise ValueError(f"mapping {key!r} must be a column name (str), got {value!r}")
            changes[key] = value
        if changes.get("prompt_tokens", self.prompt_tokens) is None or \
                changes.get("output_tokens", self.output_tokens) is None:
            raise ValueError("mapping must name the prompt_tokens and output_tokens columns")
        if name is not None:
            changes["name"] = name
        return replace(self, **changes)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any], container: str) -> "Schema":
        """A generic schema from a user mapping.

        Keys: ``prompt_tokens`` and ``output_tokens`` (required column names),
        ``timestamp`` (alias ``arrival_s``; omit for a length-only source),
        ``time_unit`` (default ``"s"``), ``block_hashes``, ``block_size`` (default 512),
        ``tenant``, ``slo_class``. Raises ValueError on unknown keys or bad values.
        """
        base = cls(name=container, container=container, timestamp=None,
                   prompt_tokens="", output_tokens="")
        return base.with_mapping({"prompt_tokens": None, "output_tokens": None, **mapping})


PRESETS: dict[str, Schema] = {
    "mooncake": Schema("mooncake", "jsonl", "timestamp", "input_length", "output_length",
                       time_unit="ms", block_hashes="hash_ids", block_size=512),
    "azure": Schema("azure", "csv", "TIMESTAMP", "ContextTokens", "GeneratedTokens",
                    time_unit="datetime"),
    "burstgpt": Schema("burstgpt", "csv", "Timestamp", "Request tokens", "Response tokens",
                       time_unit="s", tenant="Model", slo_class="Log Type",
                       zero_output_is_failure=True),
    "vidur": Schema("vidur", "csv", None, "num_prefill_tokens", "num_decode_tokens"),
}
FORMAT_ALIASES = {"lengths": "vidur", "mooncake_jsonl": "mooncake", "azure_csv": "azure"}
FORMATS = (*PRESETS, "csv", "jsonl")


def _first_line(path: Path) -> str | None:
    """The first non-blank line of the file (decoded), or None if there is none."""
    with open_binary(path) as f:
        for raw in f:
            if raw.strip():
                return raw.decode("utf-8-sig", errors="replace").strip()
    return None


def split_csv_header(line: str) -> list[str]:
    import csv
    return [c.strip() for c in next(csv.reader([line]))]


def detect_schema(path: Path, format: str | None = None,
                  mapping: Mapping[str, Any] | None = None) -> Schema:
    """The schema for `path`: from `format` if given, else from the first line.

    JSONL is recognised by a first line that starts with ``{``; its keys (or a CSV's
    header) pick the preset. `mapping` overrides a detected preset's columns and units
    (``{"block_size": 256}`` or ``{"time_unit": "s"}`` alone keep the detection: `rack
    trace stats --block-size` on a Mooncake file is still a Mooncake file), or
    describes a generic file when no preset matches (it must then name the prompt and
    output columns). Raises TraceError (empty file, unknown layout) or ValueError
    (unknown format name, bad mapping).
    """
    if format is not None:
        fmt = FORMAT_ALIASES.get(format.lower(), format.lower())
        if fmt in PRESETS:
            schema = PRESETS[fmt]
            return schema.with_mapping(mapping) if mapping else schema
        if fmt in ("csv", "jsonl", "generic"):
            if not mapping:
                raise ValueError(f"format {format!r} needs a column mapping (mapping=...)")
            if fmt == "generic":
                first = _first_line(path)
                if first is None:
                    raise _empty(path)
                fmt = "jsonl" if first.startswith("{") else "csv"
            return Schema.from_mapping(mapping, fmt)
        raise ValueError(f"unknown trace format {format!r}; known: {', '.join(FORMATS)}")

    first = _first_line(path)
    if first is None:
        raise _empty(path)
    if first.startswith("{"):
        depth = json_depth(first) if brackets(first) > MAX_ROW_DEPTH else 0
        if depth > MAX_ROW_DEPTH:        # before the parser, which recurses per level
            raise TraceError(str(path), 1, None, f"invalid JSON (nested {depth:,} levels deep; a trace row "
                             f"nests at most {MAX_ROW_DEPTH})", "invalid_json")
        try:
            data = json.loads(first)
        except ValueError as e:
            raise TraceError(str(path), 1, None, f"invalid JSON: {e}", "invalid_json") from None
        if not isinstance(data, dict):
            raise TraceError(str(path), 1, None, f"expected a JSON object per line, got {first[:200]!r}",
                             "invalid_json")
        keys = set(data)
        if {"timestamp", "input_length", "output_length"} <= keys:
            preset = PRESETS["mooncake"]
            if "hash_ids" not in keys:  # Mooncake-shaped but without prefix hashes
                preset = replace(preset, block_hashes=None)
            return preset.with_mapping(mapping) if mapping else preset
        if mapping:
            return Schema.from_mapping(mapping, "jsonl")
        raise TraceError(
            str(path), 1, None,
            f"unknown JSONL layout (keys: {', '.join(sorted(keys))}); expected Mooncake "
            "keys timestamp, input_length, output_length[, hash_ids], or pass a mapping",
        )
    if Path(path).suffix.lower() in (".jsonl", ".json", ".ndjson"):
        # named as JSON lines: a first line that is not an object is a broken JSONL
        # file, not a CSV with an unknown header
        raise TraceError(str(path), 1, None,
                         f"expected a JSON object per line, got {first[:200]!r}", "invalid_json")
    cols = set(split_csv_header(first))
    for schema in PRESETS.values():
        if schema.container == "csv" and set(schema.columns()) - {schema.tenant, schema.slo_class} <= cols:
            return schema.with_mapping(mapping) if mapping else schema
    if mapping:
        return Schema.from_mapping(mapping, "csv")
    raise TraceError(
        str(path), 1, None,
        f"unknown CSV header ({first[:200]}); expected the Azure (TIMESTAMP,ContextTokens,"
        "GeneratedTokens), BurstGPT (Timestamp,Model,Request tokens,Response tokens,...) or "
        "vidur (num_prefill_tokens,num_decode_tokens,...) columns, or pass a mapping",
    )


def _empty(path: Path) -> TraceError:
    return TraceError(str(path), 1, None, "the file is empty (no header and no rows)", None)
