"""Loading a scenario as a user names it: a shipped name or a TOML file, parsed
(`rack.wiring.scenario`, the schema) and then checked against the hardware it names
(`rack.wiring.sizing`: the model, each pool's device and stack, and whether the weights
fit one instance). The schema does not import the sizing; this module joins them.
"""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

from devices.borrow import resolve_stack
from devices.catalog import resolve_model

from .scenario import DEFAULT_SCENARIO, SCENARIO_DIR, Scenario, ScenarioError, parse_scenario, scenario_names
from .sizing import check_fit, cost_model

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def load_scenario(name_or_path: str | Path | None = None) -> Scenario:
    """Load a shipped scenario by name, or a TOML file by path.

    Raises ScenarioError for an empty name, a missing, unreadable or non-UTF-8 file, a
    directory, FIFO or other non-regular file, a broken symbolic link, bad TOML (with
    line) or a bad field.
    """
    from workloads.paths import file_problem, name_problem, shown

    if name_or_path is None:
        name_or_path = DEFAULT_SCENARIO
    bad = name_problem(name_or_path)
    if bad is not None:
        raise ScenarioError(f"scenario {shown(name_or_path)!r}: {bad}; expected a TOML file path or one of "
                            f"{scenario_names()}")
    path = Path(name_or_path)
    # a shipped name may hold a dot ("wafer-only-kimi-k2.6"): only .toml marks a path
    if path.suffix != ".toml" and not os.path.lexists(path):
        path = SCENARIO_DIR / f"{name_or_path}.toml"
        if not path.exists():
            close = difflib.get_close_matches(str(name_or_path), scenario_names(), n=3)
            hint = f"; did you mean {close}?" if close else ""
            raise ScenarioError(
                f"unknown scenario {str(name_or_path)!r}: expected a TOML file path or one of "
                f"{scenario_names()}{hint}")
    bad = file_problem(path)
    if bad is not None:
        raise ScenarioError(f"{shown(path)}: {bad}; expected a scenario TOML file or one of {scenario_names()}")
    if not path.exists():
        raise ScenarioError(f"{shown(path)}: no such scenario file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                            f"{exc.start}); expected a scenario TOML file") from None
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the scenario file ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from None
    scenario = parse_scenario(data, str(path))
    check_hardware(scenario, str(path))
    return scenario


def check_hardware(scenario: Scenario, source: str = "<scenario>") -> None:
    """Resolve the model and every pool's device (catalog name or file) and check that
    the weights fit one instance of each pool, as `build_topology` will. Raises
    ScenarioError naming `source`, the field and what is needed (closest catalog names
    for an unknown one; the instance size the weights need)."""
    try:
        model = resolve_model(scenario.model)
    except (ValueError, KeyError, OSError) as exc:
        raise ScenarioError(f"{source}: field model: {_file_problem(scenario.model, exc)}") from None
    limit = model.max_context_tokens
    if scenario.max_model_len is not None and limit is not None and scenario.max_model_len > limit:
        raise ScenarioError(f"{source}: field max_model_len: {scenario.max_model_len} exceeds {model.name}'s "
                            f"context of {limit} tokens (expected <= {limit}, or leave it out)")
    for i, p in enumerate(scenario.pools):
        try:
            resolve_stack(p.device, p.stack)        # a framework without a stack file borrows one
        except (ValueError, KeyError, OSError) as exc:
            field = "stack" if p.stack is not None and "software stack" in str(exc) else "device"
            raise ScenarioError(f"{source}: field pools[{i}].{field} (pool {p.name!r}): "
                                f"{_file_problem(p.device, exc)}") from None
        try:
            check_fit(scenario, p, cost_model(scenario, p))
        except ScenarioError as exc:
            raise ScenarioError(f"{source}: field pools[{i}] (tp, pp): {exc}") from None


def _file_problem(name: str, exc: Exception) -> str:
    """The message of a catalog look-up error, naming the file for the errors of
    reading one (a directory, unreadable, not UTF-8), whose own messages do not."""
    if isinstance(exc, UnicodeDecodeError):
        return f"{name}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})"
    if isinstance(exc, OSError):
        return f"{name}: cannot read the file ({exc.strerror or exc})"
    return str(exc)
