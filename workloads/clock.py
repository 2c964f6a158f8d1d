"""The emulated clock that every component reads time through.

Components never call `time.time()` or `asyncio.sleep`; they are given a `Clock`.
The virtual runtime's clock jumps to the next timer; the Ray runtime's clock is the
wall clock divided by a dilation factor (see `rack.runtime`).
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Emulated time in seconds since the run's epoch."""

    def now(self) -> float:
        """Current emulated time (s)."""
        ...

    async def sleep_until(self, t: float) -> None:
        """Return at emulated time >= `t` (s); at once if `t` is in the past."""
        ...

    async def wait_until(self, event: asyncio.Event, t: float | None) -> bool:
        """Wait until `event` is set or emulated time `t` (s) is reached.

        `t=None` waits for the event only. Returns True if the event was set (it is
        not cleared), False if the deadline came first.
        """
        ...
