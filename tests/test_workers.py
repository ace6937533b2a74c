from __future__ import annotations

import json
import os
from importlib.metadata import entry_points
from pathlib import Path

import pa_oracle.fuzz.campaign.engine
import pytest
from click.testing import CliRunner
from pa_oracle.backends import get_backend
from pa_oracle.fuzz.campaign.coverage import Coverage
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.fuzz.campaign.state import BackendResult, FindingRecord, load_shards, merge_results
from pa_oracle.fuzz.draw.strategies import Limits
from pa_oracle.fuzz.run.workers import assign_gpus, visible_gpus, worker_env

from pa_oracle.cli import main

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


def plugin_args() -> list[str]:
    """``-p pa_oracle.fuzz.plugin`` where the package is not installed (the plugin is then not an entry point)."""
    installed = any(ep.name == "pa_oracle" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "pa_oracle.fuzz.plugin"]


def test_shards_split_chunk_seeds_case_seeds_and_budgets_without_overlap() -> None:
    shards = [Shard(i, 3) for i in range(3)]
    chunk_seeds = [s.chunk_seed(7, j) for s in shards for j in range(50)]
    assert len(set(chunk_seeds)) == 150 and set(chunk_seeds) == set(range(7, 157)), "the shards interleave one campaign"
    case_seeds = [s.case_seed(drawn) for s in shards for drawn in range(100)]
    assert len(set(case_seeds)) == 300
    assert [sum(s.share(n) for s in shards) for n in (0, 1, 2, 10, 1001)] == [0, 1, 2, 10, 1001]
    assert Shard().chunk_seed(7, 4) == 11 and Shard().case_seed(12345) == 12345, "one shard draws what it always drew"


@pytest.mark.parametrize("text, message", [("2/2", "0 <= INDEX < COUNT"), ("1", "INDEX/COUNT"), ("a/b", "INDEX/COUNT"), ("0/0", "0 <= INDEX")])
def test_bad_shards_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Shard.parse(text)


def test_workers_are_pinned_round_robin_and_share_the_cpu_without_gpus(monkeypatch) -> None:
    assert assign_gpus(5, ["3", "5"]) == ["3", "5", "3", "5", "3"]
    assert worker_env("5", 2, {"CUDA_VISIBLE_DEVICES": "3,5", "X": "1"}) == {"CUDA_VISIBLE_DEVICES": "5", "X": "1"}
    cpu = worker_env(None, 2, {})
    assert "CUDA_VISIBLE_DEVICES" not in cpu and int(cpu["OMP_NUM_THREADS"]) >= 1
    assert worker_env(None, 2, {"OMP_NUM_THREADS": "7"})["OMP_NUM_THREADS"] == "7"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 6,")
    assert visible_gpus() == ["2", "6"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert visible_gpus() == []


def test_merge_adds_counters_and_coverage_and_keeps_every_finding() -> None:
    def shard_result(examples: int, seconds: float, page: str, finding: bool) -> BackendResult:
        cov = Coverage({"page_size": {page: examples}})
        found = [FindingRecord(f"id{page}", "fail", "m", "case", None, None)] if finding else []
        return BackendResult("b", examples=examples, passed=examples - finding, seconds=seconds, coverage=cov,
                             declared={"page_size": ["1", "16"]}, findings=found, seen=[page], status="done")

    (merged,) = merge_results([[shard_result(10, 3.0, "1", False)], [shard_result(7, 5.0, "16", True)]])
    assert (merged.examples, merged.passed, merged.seconds) == (17, 16, 5.0)
    assert merged.coverage.counts == {"page_size": {"1": 10, "16": 7}} and merged.coverage_fraction == 1.0
    assert [f.case_id for f in merged.findings] == ["id16"] and merged.status == "finding" and merged.seen == ["1", "16"]


def test_a_shard_runs_its_own_case_seeds(monkeypatch) -> None:
    seeds = []
    real = pa_oracle.fuzz.run.runner.check_case

    def recording(backend, case, tolerance, *rest):  # type: ignore[no-untyped-def]
        seeds.append(case.seed)
        return real(backend, case, tolerance, *rest)

    monkeypatch.setattr(pa_oracle.fuzz.run.runner, "check_case", recording)
    result = fuzz_backend(get_backend("sdpa-math"), CampaignConfig(examples=6, shard=Shard(1, 3), limits=Limits(max_batch=2, max_kv_len=12)))
    assert result.examples == 6 and len(seeds) == 6 and all(s % 3 == 1 for s in seeds), seeds


def test_two_workers_on_cpu_merge_into_one_summary(tmp_path) -> None:
    out = tmp_path / "two"
    args = ["fuzz", "-b", "sdpa-math", "-n", "9", "--max-batch", "2", "--max-kv-len", "12", "--out", str(out), "--json"]
    result = CliRunner().invoke(main, [*args, "--workers", "2"])
    assert result.exit_code == 0, result.output
    (summary,) = json.loads(result.stdout)
    assert summary["examples"] == summary["passed"] == 9 and summary["findings"] == []
    assert json.loads((out / "summary.json").read_text()) == [summary]
    states = load_shards(out)
    assert [s.config["shard"] for s in states] == ["0/2", "1/2"]
    per_shard = [s.results["sdpa-math"] for s in states]
    assert [r.examples for r in per_shard] == [5, 4]
    assert not set(per_shard[0].seen) & set(per_shard[1].seen), "two workers ran the same case"
    merged = CliRunner().invoke(main, ["fuzz", "--merge", "--out", str(out), "--json"])
    assert merged.exit_code == 0 and json.loads(merged.stdout) == [summary]
    (out / "shards" / "campaign-1-of-2.json").unlink()
    partial = CliRunner().invoke(main, ["fuzz", "--merge", "--out", str(out), "--json"])
    assert "no state yet for shards 1/2" in partial.output and json.loads(partial.stdout)[0]["examples"] == 5


def test_workers_refuse_a_shard_option(tmp_path) -> None:
    result = CliRunner().invoke(main, ["fuzz", "-b", "sdpa-math", "--workers", "2", "--shard", "0/2", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "give --shard only without --workers" in result.output


def test_xdist_workers_get_one_gpu_each_and_one_shard_each(pytester: pytest.Pytester, monkeypatch, tmp_path) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(
        test_env="""
        import os
        import pathlib

        import pytest

        from pa_oracle.fuzz.plugin import shard_count

        @pytest.mark.parametrize("i", range(4))
        def test_pinned(request, i):
            worker = request.config.workerinput["workerid"]
            seen = f"{os.environ.get('CUDA_VISIBLE_DEVICES')} {shard_count(request.config)}"
            (pathlib.Path(os.environ["PA_TEST_DIR"]) / worker).write_text(seen)
        """
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    monkeypatch.setenv("PA_TEST_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    args = ["-p", "no:cacheprovider", *plugin_args()]
    result = pytester.runpytest_subprocess(*args, "-q", "-n", "2", "--pa-pin-gpus", "test_env.py")  # -q: no header, no torch
    result.assert_outcomes(passed=4)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"gw0": "5 2", "gw1": "7 2"}
    collected = pytester.runpytest(*args, "--collect-only", "-q", "--pyargs",
                                   "pa_oracle.fuzz.test_conformance", "--pa-backend", "sdpa-math", "--pa-shards", "2")
    assert sum("sdpa-math-shard" in line for line in collected.outlines) == 2, collected.outlines


def test_shards_on_one_host_share_its_cores_for_draw_and_worker_processes(monkeypatch, tmp_path) -> None:
    """Four shards on 16 cores: 4 cores each, none past the four a campaign keeps, so no draw process (three each
    would be 12 more processes) and, on a GPU, one worker process each; two shards: 8 cores each, three draw
    processes and two worker processes each; a value the user set is passed as it is."""
    import pa_oracle.fuzz.run.workers as workers_module

    envs: list[dict[str, str]] = []

    class Recorded:
        def __init__(self, cmd, env, stdout) -> None:  # type: ignore[no-untyped-def]
            envs.append(env)

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(workers_module.subprocess, "Popen", Recorded)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.delenv("PA_ORACLE_DRAW_PROCESSES", raising=False)
    for count, each in ((4, "0"), (2, "3")):
        envs.clear()
        CliRunner().invoke(main, ["fuzz", "-b", "sdpa-math", "-n", "4", "--workers", str(count), "--out", str(tmp_path / str(count))])
        assert [env.get("PA_ORACLE_DRAW_PROCESSES") for env in envs] == [each] * count
        assert all("PA_ORACLE_WORKER_PROCESSES" not in env for env in envs), "no GPU: a shard's CPU worker is one process"
    monkeypatch.setenv("PA_ORACLE_DRAW_PROCESSES", "1")
    envs.clear()
    CliRunner().invoke(main, ["fuzz", "-b", "sdpa-math", "-n", "4", "--workers", "2", "--out", str(tmp_path / "set")])
    assert [env.get("PA_ORACLE_DRAW_PROCESSES") for env in envs] == ["1", "1"]
    monkeypatch.setattr("pa_oracle.fuzz.run.workers.visible_gpus", lambda: ["0"])
    monkeypatch.delenv("PA_ORACLE_WORKER_PROCESSES", raising=False)
    for count, each in ((4, "1"), (2, "2")):  # on one GPU: 4 cores a shard, one worker process each; 8: two
        envs.clear()
        CliRunner().invoke(main, ["fuzz", "-b", "sdpa-math", "-n", "4", "--workers", str(count), "--out", str(tmp_path / f"gpu{count}")])
        assert [env.get("PA_ORACLE_WORKER_PROCESSES") for env in envs] == [each] * count
