"""One compile plan per command (``pa_oracle.fuzz.campaign.compile_plan``): variants chosen within the budget before
judging, built together in build processes while ready backends judge, what cannot be built named; the one
compile-cache folder (``PA_ORACLE_CACHE_DIR``). flex is the CPU backend that compiles (a warm-up per key)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from pa_oracle.backends import get_backend
from pa_oracle.fuzz.caches import LIBRARY_CACHES, use_compile_caches
from pa_oracle.backends.sdpa import SdpaMath
from pa_oracle.cli import main
from pa_oracle.fuzz.campaign.builds import Build, Builds, BuildTask
from pa_oracle.fuzz.campaign.compile_plan import MAX_KEYS, CompilePlan, estimated_wall
from pa_oracle.fuzz.campaign.engine import CampaignConfig, run_campaign
from pa_oracle.fuzz.campaign.state import CampaignState
from pa_oracle.fuzz.draw.strategies import Limits
from pa_oracle.fuzz.exits import BAD_INPUT, NO_FINDING, campaign_exit_code

LIMITS = Limits(max_batch=2, max_kv_len=20)


class _Keyed(SdpaMath):
    """sdpa-math pretending to compile one variant per q dtype (not registered)."""

    name = "test-keyed"
    compile_fields = ("q_dtype",)
    compile_seconds = 10.0


class _Expensive(_Keyed):
    name = "test-expensive"
    compile_seconds = 500.0


class _HalfBuilt(_Keyed):
    name = "test-half-built"

    def built_reason(self, key):  # type: ignore[no-untyped-def]
        return "prebuilt" if dict(key)["q_dtype"] == "float32" else None


def test_the_plan_fits_the_budget_together_and_names_what_it_leaves_out() -> None:
    plan = CompilePlan.make([_Keyed(), _Expensive(), _HalfBuilt()], LIMITS, budget=25.0, seed=0, parallel=2)
    costs = [p.backend.compile_seconds for p in plan.plans.values() for _ in p.chosen]
    assert estimated_wall(costs, 2) <= 25.0 and costs, "keys planned within the budget, built side by side"
    assert "test-expensive" in plan.left_out and "~500s" in plan.left_out["test-expensive"]
    assert "--compile-budget 500" in plan.left_out["test-expensive"], "the way out is said"
    keyed = plan.plans["test-keyed"]
    assert keyed.chosen and not keyed.ready(), "nothing built yet: a planned key is not drawn before its build"
    half = plan.plans["test-half-built"]
    assert half.ready() and set(half.free) == {(("q_dtype", "float32"),)}, "a prebuilt key is usable at once"
    assert len(keyed.chosen) + len(keyed.refused) == min(MAX_KEYS, keyed.space)
    assert "refused by the budget" in keyed.plan_line()


def test_a_cheap_backend_is_not_left_out_for_an_expensive_one() -> None:
    class Costly(_Keyed):
        name = "test-costly"
        compile_seconds = 20.0

    plan = CompilePlan.make([Costly(), _Keyed()], LIMITS, budget=20.0, seed=0, parallel=1)
    assert plan.plans["test-keyed"].chosen and "test-keyed" not in plan.left_out
    assert "test-costly" in plan.left_out, "20 s did not fit beside the 10 s key: said, not hidden"


def test_consecutive_seeds_plan_other_keys_and_a_seed_plans_the_same() -> None:
    first = CompilePlan.make([_Keyed()], LIMITS, budget=10.0, seed=0, parallel=1).plans["test-keyed"].chosen
    again = CompilePlan.make([_Keyed()], LIMITS, budget=10.0, seed=0, parallel=1).plans["test-keyed"].chosen
    second = CompilePlan.make([_Keyed()], LIMITS, budget=10.0, seed=1, parallel=1).plans["test-keyed"].chosen
    assert first == again and len(first) == 1 and first != second


def test_builds_report_a_failed_load_and_close_stops_what_still_runs() -> None:
    got: list[Build] = []
    bad = BuildTask(0, "no-such-backend", "no-such-backend", None, (("q_dtype", "float32"),), LIMITS, ahead=True)
    builds = Builds([bad], got.append, parallel=1, jobs=1)
    builds.start()
    deadline = time.monotonic() + 120
    while builds.pending and time.monotonic() < deadline:
        builds.wait(1.0)
    builds.close()
    assert len(got) == 1 and got[0].error is not None and "no-such-backend" in got[0].error

    flex = get_backend("flex")
    from pa_oracle.fuzz.campaign.variants import candidates

    keys = candidates(flex, LIMITS)[2][:2]  # type: ignore[index]
    slow = [BuildTask(i, "flex", "flex", flex.capabilities, key, LIMITS, ahead=False) for i, key in enumerate(keys)]
    builds = Builds(slow, got.append, parallel=1, jobs=1)
    builds.start()
    before = len(got)
    unfinished = builds.close()  # at once: the warm-ups had no time to end
    assert unfinished and all(not p.is_alive() for p, _ in builds._processes), "the build process was stopped"
    time.sleep(0.5)
    assert len(got) == before and not builds.done, "a key stopped by close() is unfinished, not a failed build"


def test_an_ahead_build_the_adapter_declines_is_a_warm_up_and_backends_load_before_threads() -> None:
    """FlashInfer's sink and POD adapters return None from build_variants (they build by judging a case): a build
    process warms such a key instead of calling it failed; several tasks of several backends load each backend once,
    before the threads start (the registry's discovery raced when threads loaded them: 'unknown backend')."""
    from pa_oracle.fuzz.campaign.variants import candidates

    got: list[Build] = []
    flex, sdpa = get_backend("flex"), get_backend("sdpa-math")
    key = candidates(flex, LIMITS)[2][0]  # type: ignore[index]
    tasks = [BuildTask(0, "flex", "flex", flex.capabilities, key, LIMITS, ahead=True),
             BuildTask(1, "sdpa-math", "sdpa-math", sdpa.capabilities, (("q_dtype", "float32"),), LIMITS, ahead=True)]
    builds = Builds(tasks, got.append, parallel=2, jobs=2)
    builds.start()
    deadline = time.monotonic() + 300
    while builds.pending and time.monotonic() < deadline:
        builds.wait(1.0)
    builds.close()
    by = {b.task.backend: b for b in got}
    assert by["flex"].error is None and by["flex"].warmed, by["flex"]
    assert by["sdpa-math"].warmed and (by["sdpa-math"].error is None or "unknown backend" not in by["sdpa-math"].error)


def test_a_campaign_judges_ready_backends_while_a_variant_builds(tmp_path: Path) -> None:
    flex, sdpa = get_backend("flex"), get_backend("sdpa-math")
    plan = CompilePlan.make([flex, sdpa], LIMITS, budget=30.0, seed=0)
    assert plan.plan_for(sdpa) is None and plan.plans["flex"].chosen and not plan.plans["flex"].ready()
    lines: list[str] = []
    state = CampaignState({"seed": 0})
    results = run_campaign([flex, sdpa], state, tmp_path / "campaign.json", CampaignConfig(examples=50, time_budget=200.0, limits=LIMITS), progress=lines.append, compile_plan=plan)
    by = {r.backend: r for r in results}
    starts = [line for line in lines if line.startswith("fuzzing ")]
    assert starts[0].startswith("fuzzing sdpa-math"), f"the ready backend judges first: {starts}"
    assert any(line.startswith("  warmed flex") for line in lines), "flex's variant was built in the build process"
    assert by["flex"].examples == 50 and by["sdpa-math"].examples == 50
    assert by["flex"].compile_seconds > 0 and by["sdpa-math"].compile_seconds == 0
    line = next(line for line in by["flex"].coverage.variants if "flex compile plan:" in line)
    assert " 0 built" not in line and "failed" not in line, line
    assert campaign_exit_code(results)[0] == NO_FINDING


def test_a_backend_still_building_at_the_end_is_not_built_and_judges_nothing(tmp_path: Path) -> None:
    flex, sdpa = get_backend("flex"), get_backend("sdpa-math")
    plan = CompilePlan.make([flex, sdpa], LIMITS, budget=30.0, seed=0)
    lines: list[str] = []
    results = run_campaign([flex, sdpa], CampaignState({"seed": 0}), tmp_path / "c.json", CampaignConfig(examples=10_000, time_budget=3.0, limits=LIMITS), progress=lines.append, compile_plan=plan)
    by = {r.backend: r for r in results}
    assert by["sdpa-math"].examples > 0 and by["flex"].examples == 0
    assert by["flex"].not_built is not None and "still building" in by["flex"].not_built
    assert by["flex"].line().startswith("flex: NOT BUILT (") and by["flex"].compile_seconds > 0, "its wait is compile time"
    assert any(line.startswith("flex: waiting for its variants to build") for line in lines)
    assert campaign_exit_code(results)[0] == NO_FINDING, "the other backend's verdict stands"
    alone = run_campaign([flex], CampaignState({"seed": 0}), tmp_path / "d.json", CampaignConfig(examples=10, time_budget=1.0, limits=LIMITS), compile_plan=CompilePlan.make([flex], LIMITS, budget=30.0, seed=1))
    code, why = campaign_exit_code(alone)
    assert code == 3 and "no backend judged a case" in why[-1], "a run that judged nothing at all is no verdict"


def test_a_backend_whose_builds_all_failed_is_no_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flex = get_backend("flex")
    plan = CompilePlan.make([flex], LIMITS, budget=30.0, seed=0)
    monkeypatch.setattr("pa_oracle.fuzz.campaign.engine.isolatable", lambda backend: "no-such-backend")  # its build cannot load it
    results = run_campaign([flex], CampaignState({"seed": 0}), tmp_path / "c.json", CampaignConfig(examples=10, time_budget=100.0, limits=LIMITS), compile_plan=plan)
    assert results[0].status == "incomplete" and results[0].examples == 0
    assert "could be built" in results[0].notes[-1] and "no-such-backend" in results[0].notes[-1]
    assert campaign_exit_code(results)[0] == 3


def test_a_named_backend_the_budget_cannot_build_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(get_backend("flex")), "compile_seconds", 1000.0)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["fuzz", "-b", "flex", "-b", "sdpa-math", "--time-budget", "20", "--out", str(out)])
    assert result.exit_code == BAD_INPUT, result.output
    assert "flex" in result.output and "~1000s" in result.output and "--compile-budget 1000" in result.output
    assert not (out / "campaign.json").exists()


def test_the_default_job_leaves_out_what_it_cannot_build_and_exits_by_the_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pa_oracle.backends as registry

    monkeypatch.setattr(type(get_backend("flex")), "compile_seconds", 1000.0)
    monkeypatch.setattr(registry, "available", lambda: ([get_backend("sdpa-math"), get_backend("flex")], {}))
    result = CliRunner().invoke(main, ["fuzz", "--time-budget", "30", "-n", "25", "--out", str(tmp_path), "--json"])
    assert result.exit_code == NO_FINDING, result.output
    assert "left out flex" in result.output and "flex: LEFT OUT" not in result.output  # --json: the summary is JSON
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["backend"] for r in summary] == ["sdpa-math"] and summary[0]["examples"] == 25


def test_the_cache_folder_holds_every_compile_cache_and_keeps_a_users_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for variable in LIBRARY_CACHES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PA_ORACLE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/mine")
    got = use_compile_caches()
    assert got["TRITON_CACHE_DIR"] == "/somewhere/mine"
    assert got["FLASHINFER_WORKSPACE_BASE"] == str(tmp_path / "flashinfer") and got["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")


def test_a_second_warm_up_with_the_kept_cache_folder_compiles_nothing_new(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in LIBRARY_CACHES}
    env["PA_ORACLE_CACHE_DIR"] = str(tmp_path / "caches")
    command = [sys.executable, "-m", "pa_oracle", "warmup", "-b", "flex", "--variants", "1"]
    files = []
    for run in range(2):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "warmed flex" in done.stdout and "1 built" in done.stdout
        files.append(sorted(p for p in (tmp_path / "caches").rglob("*") if p.is_file()))
    assert files[0], "the first warm-up compiled into the cache folder"
    assert files[1] == files[0], "the second found everything there: nothing new was compiled"


def test_the_summary_accounts_for_every_second_of_the_run(tmp_path: Path) -> None:
    """The time line's parts (the backends' start / compile / judge, and the rest) add up to the run's wall time."""
    import re

    result = CliRunner().invoke(main, ["fuzz", "-b", "sdpa-math", "-b", "flex", "-n", "5", "--time-budget", "120",
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code == NO_FINDING, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("time: "))
    total, *parts = (float(x) for x in re.findall(r"(\d+\.\d)s", line))
    assert len(parts) == 4 and abs(sum(parts) - total) <= 0.25, line
    assert parts[2] > 0 and parts[3] >= 0, "judging took time; the rest is never negative"
