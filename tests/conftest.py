"""Shared fixtures: one Ray session for every Ray test (started on first use)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance shared by the whole test session; shut down at the end
    (never the Ray CLI's stop command, which kills every Ray process on the machine)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray = pytest.importorskip("ray")
    from rack.runtime.ray_runtime import ensure_ray

    started = not ray.is_initialized()
    ensure_ray()
    yield ray
    if started:
        ray.shutdown()
