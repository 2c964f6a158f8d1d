"""`rack bench` plumbing: the figures exist, have the right shape and units, and the
CLI writes the JSON the issue asks for. No wall-time assertions (the machine is shared);
every test runs on a few seconds of the shipped excerpt."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from rack.experiments import bench as B
from rack.runtime.virtual import VirtualDriver
from rack.runtime.virtual_run import last_run_counters
from workloads.core import Core

WINDOW = (0.0, 10.0)


class _Ticker(Core):
    """Wakes at 1, 2 and 3 s and tells itself each time."""

    def __init__(self):
        super().__init__("ticker")
        self.wake_at = 1.0
        self.heard = 0

    def tick(self, now):
        self.heard += 1

    def on_wake(self, now):
        self.send(self.name, "tick")
        self.wake_at = now + 1.0 if now < 3.0 else math.inf


def test_driver_counters_count_messages_and_wakeups():
    drv = VirtualDriver({"ticker": _Ticker()})
    drv.run(lambda: False)
    assert drv.wakeups == 3 and drv.messages == 3 and drv.now == 3.0
    assert drv.cores["ticker"].heard == 3


def test_last_run_counters_of_a_replay():
    from rack.run.runner import run_scenario
    from rack.wiring.load import load_scenario
    from workloads import load_requests

    reqs = load_requests("mooncake-excerpt", window=(0.0, 2.0))
    out = run_scenario(load_scenario(None), reqs, runtime="virtual")
    c = last_run_counters()
    assert c["callbacks"] == c["messages"] + c["wakeups"]
    assert c["virtual_s"] == out.results["emulation"]["emulated_s"] > 0
    # the router's start and every request's submission are messages; it wakes per arrival tick
    assert c["messages"] > len(reqs) and c["wakeups"] >= len({r.arrival_s for r in reqs}) - 1


def test_replay_speed_row():
    r = B.replay_speed("mooncake-excerpt", None, repeat=2, window=WINDOW)
    assert r["requests"] > 0 and r["completed"] + r["rejected"] + r["failed"] == r["requests"]
    assert len(r["wall_s_runs"]) == 2 and r["wall_s"] > 0
    assert r["requests_per_wall_s"] == pytest.approx(r["requests"] / r["wall_s"])
    assert r["emulated_s"] > 0 and r["emulated_s_per_wall_s"] > 0
    # an event is a component wake-up: at least the router's one per arrival tick
    assert r["events"] >= r["requests"] and r["events_per_request"] == pytest.approx(r["events"] / r["requests"])


def test_event_cost_doubles_the_tokens_not_the_events():
    ec = B.event_cost("mooncake-excerpt", None, repeat=1, window=WINDOW)
    assert ec["output_tokens_ratio"] > 1.9
    assert ec["doubled_output_ratio"] == pytest.approx(ec["wall_s_doubled"] / ec["wall_s"])
    # the engines skip between batch changes: events grow far less than tokens
    assert ec["events_ratio"] < 1.5


def test_codec_speed_has_ratio_to_memcpy():
    c = B.codec_speed((0.25,), repeat=1, sample_s=0.001)
    row = c["0.25MB"]
    assert row["bytes"] == 2**18
    for k in ("memcpy_GBps", "encode_GBps", "decode_GBps", "encode_decode_GBps", "ratio_to_memcpy"):
        assert row[k] > 0
    assert row["ratio_to_memcpy"] == pytest.approx(row["encode_decode_GBps"] / row["memcpy_GBps"], rel=1e-9)


def test_checks_evaluate_targets():
    fake = {"replay": {"azure_conv": {"wall_s": 4.0}, "mooncake_conv": {"wall_s": 6.0}},
            "event_cost": {"doubled_output_ratio": 1.05, "wall_s_runs": [1.0] * 3, "wall_s_doubled_runs": [1.05] * 3},
            "codec": {"16MB": {"ratio_to_memcpy": 0.49}},
            "pacing": {"default": {"p99_over_tpot": 0.004}, "sustainable_rate_scale": 4.0}}
    c = B.checks(fake)
    assert c["replay.azure_conv.wall_s"]["ok"] and not c["replay.mooncake_conv.wall_s"]["ok"]
    assert c["event_cost.doubled_output_ratio"]["ok"]
    assert not c["codec.16MB.ratio_to_memcpy"]["ok"]
    assert c["pacing.default.p99_over_tpot"]["ok"] and c["pacing.sustainable_rate_scale"]["value"] == 4.0
    # a replay of a window is not the whole trace the target is for: not judged
    windowed = {"replay": {"azure_conv": {"wall_s": 2.0, "scenarios": {"s": {"window": [0.0, 600.0]}}}}}
    assert B.checks(windowed)["replay.azure_conv.wall_s"]["ok"] is None
    assert B.checks(windowed)["replay.azure_conv.wall_s"]["na"] == "window"
    # a ratio of two single runs (--quick) is noise-bound: reported, not judged
    single = {"event_cost": {"doubled_output_ratio": 1.22, "wall_s_runs": [2.47], "wall_s_doubled_runs": [3.0]}}
    c1 = B.checks(single)["event_cost.doubled_output_ratio"]
    assert c1["ok"] is None and c1["na"] == "fewer than 3 runs" and c1["value"] == 1.22


def test_lateness_rows_in_microseconds():
    res = {"emulation": {"lateness_by_actor": {
        "router": {"p50": 1e-6, "p99": 2e-6, "max": 3e-6, "n": 5, "mean": 1e-6, "p90": 2e-6},
        "idle": {"p50": None, "p99": None, "max": None, "n": 0, "mean": None, "p90": None}}}}
    rows = B._lateness_rows(res)
    assert list(rows) == ["router"]
    assert rows["router"]["p99_us"] == pytest.approx(2.0) and rows["router"]["n"] == 5


def test_cli_json_has_the_issue_keys(tmp_path):
    from rack.cli import _register_commands
    from rack.cli.app import app

    _register_commands()
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(app, ["bench", "--json", "--skip-ray", "--repeat", "1", "--window", "0:8",
                                   "--trace", "mooncake-excerpt", "--trace", "azure-conv-excerpt",
                                   "--scenario", "helios-cs3-kimi-k2", "--codec-mb", "16",
                                   "--memory-requests", "300", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["replay"]["mooncake-excerpt"]["wall_s"] > 0
    assert data["replay"]["azure-conv-excerpt"]["wall_s"] > 0
    assert data["event_cost"]["doubled_output_ratio"] > 0
    assert data["codec"]["16MB"]["ratio_to_memcpy"] > 0
    assert data["pacing"] == {"skipped": "--skip-ray"}
    assert data["checks"]["replay.mooncake-excerpt.wall_s"]["ok"] is None     # a window: not judged
    # peak RSS of a replay in a child process, records streamed and held
    runs = data["memory"]["runs"]
    assert [(r["source"], r["requests"], r["records"]) for r in runs] == [
        ("random", 300, "disk"), ("random", 300, "memory"), ("mooncake", 300, "disk")]
    assert all(r["completed"] == 300 and 30 < r["peak_rss_mb"] < 4096 for r in runs)
    assert data["checks"]["memory.peak_rss_mb_1M_requests"]["ok"] is None     # not a 1M run


def test_cli_rejects_a_bad_window():
    from rack.cli import _register_commands
    from rack.cli.app import app

    _register_commands()
    res = CliRunner().invoke(app, ["bench", "--skip-ray", "--window", "nonsense"])
    assert res.exit_code == 2


def test_cli_refuses_a_bad_out_path_and_codec_size_before_measuring(tmp_path):
    """An --out under a file and a --codec-mb <= 0 fail at once with one line, not with
    a traceback after the whole benchmark has run (its measurement lost)."""
    from rack.cli import _register_commands
    from rack.cli.app import app

    _register_commands()
    (tmp_path / "afile").write_text("x")
    for args, said in ((["--out", str(tmp_path / "afile" / "x.json")], "--out"),
                       (["--out", str(tmp_path)], "is a directory"),
                       (["--codec-mb", "-1"], "--codec-mb: expected a finite number > 0")):
        res = CliRunner().invoke(app, ["bench", "--quick", "--skip-ray", "--skip-memory", *args])
        assert res.exit_code == 2 and said in res.output and "Traceback" not in res.output, (args, res.output)


# ---------------------------------------------------------------------------- --baseline
def test_baseline_section_compares_two_checkouts_in_one_run():
    """The same code as its own baseline (a checkout path): both sides replay the same
    window in subprocesses and agree on what they served; the ratio is baseline/current."""
    from rack.experiments import bench_baseline as BB

    root = str(BB.project_root())
    out = BB.baseline_section(root, ["mooncake-excerpt"], "helios-cs3-kimi-k2", repeat=1, window=WINDOW)
    rows = out["traces"]["mooncake-excerpt"]
    for key in ("x1", "x2"):
        r = rows[key]
        assert r["completed"]["baseline"] == r["completed"]["current"] > 0
        assert r["ttft_p50_s"]["baseline"] == r["ttft_p50_s"]["current"]
        assert r["speedup"] == pytest.approx(r["baseline_wall_s"] / r["current_wall_s"])
    assert set(rows["doubled_output_ratio"]) == {"baseline", "current"}
    chk = B.checks({"baseline": out})["baseline.mooncake-excerpt.speedup"]
    assert chk["ok"] is None and chk["na"] == "window"


def test_baseline_bad_ref_is_refused_before_measuring(tmp_path):
    from rack.experiments.bench_baseline import check_ref

    with pytest.raises(ValueError, match="neither a directory nor a git revision"):
        check_ref("no-such-revision-xyz")
    with pytest.raises(ValueError, match="no rack/ package"):
        check_ref(str(tmp_path))
    from rack.cli import _register_commands
    from rack.cli.app import app

    _register_commands()
    res = CliRunner().invoke(app, ["bench", "--baseline", "no-such-revision-xyz", "--quick"])
    assert res.exit_code == 2 and "--baseline no-such-revision-xyz" in res.output


def test_study_cost_section_compares_two_checkouts():
    # both sides are this checkout (a directory is a valid REF): same verdicts, and the
    # cost per experiment and the runs per capacity search are reported for both
    from rack.experiments.bench_baseline import project_root
    from rack.experiments.bench_study import study_cost_section

    sec = study_cost_section(str(project_root()), ["tpot"], workers=1, quick=True)
    row = sec["per_experiment"]["tpot"]
    assert sec["same_verdicts"] and row["same_verdicts"] and not sec["differences"]
    assert row["capacity_searches"] == 2 and row["runs_per_capacity"]["current"] >= 1
    assert row["baseline_wall_s"] > 0 and row["current_wall_s"] > 0 and sec["total"]["speedup"] > 0
    assert B.checks({"study_cost": sec})["study_cost.same_verdicts"]["ok"]
