"""The Ray runtime's pace limits (rack.wiring.pace): a dilation outside sane limits,
or arrivals that would take more than a week of wall time, are refused before anything
starts, with the reason; the liveness timeout follows the run's pace."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from rack.cli import _register_commands
from rack.cli.app import app
from rack.runtime.errors import RayRunError
from rack.wiring.pace import (DILATION_MAX, DILATION_MIN, LIVENESS_FLOOR_S, MAX_REPLAY_WALL_S, dilation_error,
                               liveness_timeout_s, replay_error)
from rack.wiring.scenario import ScenarioError
from rack.wiring.load import load_scenario

_register_commands()


def test_dilation_limits_have_their_reasons():
    assert dilation_error(DILATION_MIN) is None and dilation_error(DILATION_MAX) is None
    assert dilation_error(20.0) is None
    # the wall clock's float64 spacing until 2106, over the 1 us every run keeps
    assert DILATION_MIN >= math.ulp(2.0 ** 31) / 1e-6
    low = dilation_error(1e-320)
    assert low.startswith("must be at least 0.5 wall seconds per emulated second") and "1 us" in low
    assert "17 minutes" in dilation_error(1e300)
    for bad in (0.0, -1.0, math.inf, math.nan):
        assert dilation_error(bad).startswith("expected a finite number")


@pytest.mark.parametrize("value, expected", [
    ("1e-320", "--dilation 9.99989e-321: must be at least 0.5 wall seconds per emulated second"),
    ("0.3", "--dilation 0.3: must be at least 0.5"),
    ("1e300", "--dilation 1e+300: must be at most 1e+06 wall seconds per emulated second"),
])
def test_rack_run_refuses_a_dilation_outside_the_limits(value, expected, tmp_path):
    res = CliRunner().invoke(app, ["run", "--runtime", "ray", "--dilation", value, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(f"error: {expected}") and "Traceback" not in res.output


def test_a_scenario_dilation_outside_the_limits_names_the_field():
    with pytest.raises(ScenarioError, match=r"field dilation: must be at most 1e\+06 .* \(got 1e\+300\)"):
        load_scenario().with_overrides(dilation=1e300)


def test_arrivals_longer_than_a_week_of_wall_time_are_refused_unless_a_timeout_is_given(tmp_path):
    assert replay_error(100.0, 20.0, None) is None
    week_span = MAX_REPLAY_WALL_S / 1e4
    why = replay_error(week_span * 1.01, 1e4, None)
    assert why.startswith("at dilation 10000 the arrivals") and "7-day limit" in why
    assert replay_error(week_span * 1.01, 1e4, 3600.0) is None        # the user set the deadline
    res = CliRunner().invoke(app, ["run", "--runtime", "ray", "--dilation", "1e5", "--window", "0:10",
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "10.4 days of wall time, more than the 7-day limit" in res.output, res.output


def test_the_ray_driver_refuses_them_too_before_any_actor():
    from rack.runtime.ray_runtime import launch_topology, run_topology_ray
    from workloads import Request

    with pytest.raises(RayRunError, match="dilation 1e-09: must be at least"):
        launch_topology([], dilation=1e-9)
    with pytest.raises(RayRunError, match="7-day limit"):
        run_topology_ray([], [Request(id=0, arrival_s=1e6, prompt_tokens=1, output_tokens=1)], dilation=1e3)


def test_liveness_timeout_follows_the_pace():
    assert liveness_timeout_s(5.0, 0.1) == LIVENESS_FLOOR_S           # 10 TPOTs are 5 s of wall time
    assert liveness_timeout_s(100.0, 0.08) == pytest.approx(80.0)     # the default scenario
    assert liveness_timeout_s(100.0, None) == LIVENESS_FLOOR_S
