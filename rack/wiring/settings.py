"""Settings a scenario is built from that other parts also read: the error a bad
scenario raises, the energy and cost tables, fixed latency stages. Pure pydantic,
importing nothing of the project, so that the scenario, the analysis (energy, the
stage breakdown) and the CLI share them without importing each other.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class ScenarioError(ValueError):
    """A scenario file or name is invalid; the message names the file and field."""


#: Server depreciation: Amazon moved servers to 5 years in 2025; Microsoft and Google
#: use 6 years (10-K filings). 5 years is the middle ground [E].
DEFAULT_AMORTISATION_YEARS = 5.0
#: US average industrial electricity price, ~$0.08/kWh (EIA Electric Power Monthly, 2024) [M].
DEFAULT_ELECTRICITY_USD_PER_KWH = 0.08
#: Power usage effectiveness of a liquid-cooled AI data centre, 1.2-1.3 [E]
#: (Uptime Institute 2024 survey average is 1.56; hyperscalers report ~1.1).
DEFAULT_PUE = 1.3


class _Strict(BaseModel):
    # strict: a price written "2.5" is an error; no NaN or infinite figure
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


#: What a run's energy can count (`EnergySettings.boundary`).
ENERGY_BOUNDARIES = ("system", "devices")


class EnergySettings(_Strict):
    """The scenario's `[energy]` table (see `rack.measure.energy`).

    activity: which activity measure sets the devices' dynamic power ("busy" or
        "roofline").
    boundary: what a run's joules count. "system" (default): the accelerators plus the
        hosts (CPUs, memory, boards, fans), NICs and switch ports each accelerator needs,
        at `rack.measure.energy.BOUNDARY_W`'s sourced figures (a CS-3's system rating
        already includes its own host and NICs: only its external switch ports are
        added); "devices": the accelerators' board or system power alone.
    host_w / nic_w / switch_w: per-accelerator watts replacing the defaults, by device
        catalog key (e.g. {"mi455x" = 200.0}; a stack variant "mi455x-sglang" takes its
        hardware's entry), each >= 0.
    """

    activity: Literal["busy", "roofline"] = "busy"
    boundary: Literal["system", "devices"] = "system"
    host_w: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    nic_w: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    switch_w: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)


class CostSettings(_Strict):
    """The scenario's `[cost]` table (units in the names; defaults and sources in the
    constants above). `price_per_hour_usd` and `capex_usd` map a device's catalog key
    (e.g. "mi455x", "cs3") to a per-device figure that overrides the defaults."""

    basis: Literal["tco", "rental"] = "tco"
    price_per_hour_usd: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    capex_usd: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    amortisation_years: float = Field(default=DEFAULT_AMORTISATION_YEARS, gt=0)
    utilisation: float = Field(default=1.0, gt=0, le=1,
                               description="share of the device's life that is billed/used")
    electricity_usd_per_kwh: float = Field(default=DEFAULT_ELECTRICITY_USD_PER_KWH, ge=0)
    pue: float = Field(default=DEFAULT_PUE, ge=1.0)



class FixedStage(BaseModel):
    """A constant delay on every request outside the emulated rack.

    `where`: "before" (client -> rack: gateway, auth, tokenisation) or "after"
    (rack -> client: detokenisation, serialisation, network).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    name: str = Field(min_length=1)
    # at most an hour, the ceiling of the TTFT target (rack.wiring.scenario.SLOConfig): a
    # longer constant delay is a unit mistake, and 1e300 ms would swamp every time
    latency_ms: float = Field(ge=0, le=3.6e6)
    where: Literal["before", "after"] = "before"


def parse_stage(text: str) -> FixedStage:
    """`NAME=MS` or `NAME=MS:after` (e.g. "gateway=2", "serialize=0.5:after") -> FixedStage.

    Raises ValueError naming the expected form.
    """
    try:
        name, rest = text.split("=", 1)
        where = "before"
        if ":" in rest:
            rest, where = rest.split(":", 1)
        return FixedStage(name=name.strip(), latency_ms=float(rest), where=where.strip())
    except Exception:
        raise ValueError(f"fixed stage {text!r}: expected NAME=MILLISECONDS[:before|after], "
                         "e.g. gateway=2 or serialize=0.5:after") from None



__all__ = ["CostSettings", "DEFAULT_AMORTISATION_YEARS", "DEFAULT_ELECTRICITY_USD_PER_KWH", "DEFAULT_PUE",
           "ENERGY_BOUNDARIES", "EnergySettings", "FixedStage", "ScenarioError", "parse_stage"]
