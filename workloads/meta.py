"""`RequestMeta`: where a run's requests came from (a trace, a generator) and the
reader's counters; shared by `workloads.replay.RequestList` and
`workloads.table.RequestTable` (no numpy: `import workloads` stays light)."""

from __future__ import annotations

from typing import Any


class RequestMeta:
    """Provenance of a request source (shared by `RequestList` and `RequestTable`):
    name (as asked), path, format, controls (the replay parameters), rows_read,
    skipped_by_reason, skipped_examples, failed_requests, complete (see
    `workloads.replay.RequestList`)."""

    def _set_meta(self, n: int, meta: dict[str, Any]) -> None:
        self.name: str | None = meta.get("name")
        self.path: str | None = meta.get("path")
        self.format: str | None = meta.get("format")
        self.controls: dict[str, Any] = meta.get("controls", {})
        self.rows_read: int = meta.get("rows_read", n)
        self.skipped_by_reason: dict[str, int] = meta.get("skipped_by_reason", {})
        self.skipped_examples: list[str] = meta.get("skipped_examples", [])
        self.failed_requests: int = meta.get("failed_requests", 0)
        self.complete: bool = meta.get("complete", True)

    def meta(self) -> dict[str, Any]:
        """The provenance as keyword arguments of a new RequestList or RequestTable."""
        return {k: getattr(self, k) for k in ("name", "path", "format", "controls", "rows_read",
                                              "skipped_by_reason", "skipped_examples",
                                              "failed_requests", "complete")}

    @property
    def skipped_rows(self) -> int:
        return sum(self.skipped_by_reason.values())

    def summary(self) -> dict[str, Any]:
        """JSON-ready provenance and counters (requests, skipped rows by reason, ...)."""
        return {
            "name": self.name, "path": self.path, "format": self.format,
            "requests": len(self), "rows_read": self.rows_read,  # type: ignore[arg-type]
            "skipped_rows": self.skipped_rows, "skipped_by_reason": dict(self.skipped_by_reason),
            "skipped_examples": list(self.skipped_examples),
            "failed_requests": self.failed_requests, "read_whole_file": self.complete,
            "controls": dict(self.controls),
        }


__all__ = ["RequestMeta"]
