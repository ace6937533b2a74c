from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from click.testing import CliRunner
from pa_oracle.backends import get_backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend, run_campaign
from pa_oracle.fuzz.campaign.findings import load_output
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.fuzz.campaign.state import CHECKS_CAMPAIGN, CampaignState, state_path
from pa_oracle.fuzz.checks.registry import ALL_CHECKS, CHECKS
from pa_oracle.fuzz.draw.strategies import Limits
from pa_oracle.fuzz.run.isolation import IsolatedBackend, Worker
from pa_oracle.fuzz.run.runner import ORACLE, check_case
from pa_oracle.oracle.case import Case, Heads, Layout
from pa_oracle.fuzz.campaign.findings import repro_command
from pa_oracle.oracle.tensors import load_case
from pa_oracle.oracle.tolerance import Tolerance

from pa_oracle.cli import main

CASE = Case(Layout.from_lengths([1, 2], [5, 3], 4), Heads(2, 1, 8, 8))
TINY = Limits(max_batch=2, max_kv_len=12, max_qo_len=3, max_kv_heads=2, max_qo_heads=4, head_dims=(8, 16))
LOOSE = Tolerance(max_ratio=1e9, mean_ratio=1e9, floor_factor=1e9)
SLIGHTLY_OFF = "tests.reliability.bad_kernels:slightly_off"
IGNORES_PAGES = "tests.quality.contract_breakers:ignores_page_table"
CORRECT = "pa_oracle.fuzz.quality.planted:correct_attention"


def test_every_check_pickles_by_name_for_a_worker() -> None:
    for name, check in ALL_CHECKS.items():
        assert pickle.loads(pickle.dumps(check)) is check or pickle.loads(pickle.dumps(check)) == check, name


def test_a_failing_outcome_keeps_the_kernels_raw_output() -> None:
    outcome = check_case(UserKernel.from_spec(SLIGHTLY_OFF), CASE)
    assert outcome.status == "fail" and outcome.output is not None
    assert outcome.output.out.shape == (CASE.layout.total_q, 2, 8) and outcome.output.out.device.type == "cpu"
    assert check_case(get_backend("sdpa-math"), CASE).output is None, "a pass keeps nothing unless asked"


def test_a_check_runs_in_a_worker_and_its_cases_come_back() -> None:
    case = Case(Layout.from_lengths([1, 1], [9, 6], 4, extra_pages=2), Heads(2, 1, 8, 8))
    worker = IsolatedBackend(UserKernel.from_spec(IGNORES_PAGES), IGNORES_PAGES, timeout=120, judge=CHECKS["relabel"])
    try:
        outcome = worker.check(case)
    finally:
        worker.close()
    assert outcome.check == "relabel" and outcome.status == "fail", outcome.message
    assert [label for label, _, _ in outcome.cases] == ["original", "relabeled"]
    assert all(t is None or t.q.device.type == "cpu" for _, _, t in outcome.cases)


def test_the_isolated_campaign_judges_with_the_campaigns_tolerance(tmp_path: Path) -> None:
    kernel = UserKernel.from_spec(SLIGHTLY_OFF)
    kernel.capabilities = kernel.capabilities.replace(storages=("contiguous",))  # its 3 cases as before views by default
    results = {}
    for name, tolerance in (("strict", Tolerance()), ("loose", LOOSE)):
        path = state_path(tmp_path / name, Shard())
        (result,) = run_campaign([kernel], CampaignState({"seed": 0}), path, CampaignConfig(examples=3, limits=TINY, isolate=True, tolerance=tolerance, case_timeout=120))
        results[name] = result
    assert results["strict"].findings and not results["loose"].findings, results["loose"].line()
    assert results["loose"].passed == 3


def test_one_case_id_for_the_folder_the_file_the_record_replay_and_a_copy(tmp_path: Path) -> None:
    result = fuzz_backend(UserKernel.from_spec(SLIGHTLY_OFF), CampaignConfig(examples=5, limits=TINY, isolate=False, out_dir=tmp_path / "out"))
    (record,) = result.findings
    folder = Path(record.dir)
    written = json.loads((folder / "case.json").read_text())["case_id"]
    copy = tmp_path / "elsewhere" / "copy"
    copy.parent.mkdir()
    folder.rename(copy)
    assert folder.name == written == record.case_id == load_case(copy / "case.json").case_id
    replayed = CliRunner().invoke(main, ["replay", str(copy / "case.json"), "--kernel", SLIGHTLY_OFF])  # (meta.kernel is not imported)
    assert replayed.exit_code == 1 and f"on case {written}" in replayed.output, replayed.output
    assert record.repro == repro_command(str(folder / "case.json"), result.backend, SLIGHTLY_OFF)
    kept = load_output(copy / "output.npz")  # the kernel's raw output, for triage: no second run
    assert result.finding is not None and result.finding.output is not None
    assert torch.equal(kept.out, result.finding.output.out) and kept.out.dtype == result.finding.output.out.dtype
    assert (kept.lse is None) == (result.finding.output.lse is None)


def _meta(args: list[str]) -> object:
    return CliRunner().invoke(main, ["metamorphic", "-k", CORRECT, "-c", "reorder", "--only", "max_qo_len=4", *args])


def test_metamorphic_resumes_and_refuses_to_replace_its_state(tmp_path: Path) -> None:
    out = ["--out", str(tmp_path), "--no-isolate", "--json"]
    first = _meta(["-n", "3", *out])
    assert first.exit_code == 0, first.output
    assert (tmp_path / "checks.json").is_file() and json.loads(first.stdout)[0]["examples"] == 3
    again = _meta(["-n", "3", *out])
    assert again.exit_code == 2 and "--resume continues it" in again.output
    more = _meta(["-n", "5", "--resume", *out])
    assert more.exit_code == 0, more.output
    (summary,) = json.loads(more.stdout)
    assert summary["check"] == "reorder" and summary["examples"] == 5 and summary["held"] + summary["skipped"] == 5
    state = CampaignState.load(tmp_path / "checks.json")
    assert list(state.results) == [f"{CORRECT}:reorder"] and state.config["checks"] == ["reorder"]


def test_metamorphic_shards_merge_into_one_summary(tmp_path: Path) -> None:
    for i in (0, 1):
        shard = _meta(["-n", "6", "--shard", f"{i}/2", "--out", str(tmp_path), "--no-isolate"])
        assert shard.exit_code == 0, shard.output
        assert state_path(tmp_path, Shard(i, 2), CHECKS_CAMPAIGN).is_file()
    merged = _meta(["--merge", "--out", str(tmp_path), "--json"])
    assert merged.exit_code == 0, merged.output
    (summary,) = json.loads(merged.stdout)
    assert summary["examples"] == 6 and summary["backend"] == CORRECT


def test_the_oracle_is_one_check_among_the_others() -> None:
    assert ALL_CHECKS["oracle"] is ORACLE and set(CHECKS) < set(ALL_CHECKS)
    result = fuzz_backend(get_backend("sdpa-math"), CampaignConfig(examples=4, limits=TINY, isolate=False), check=ALL_CHECKS["reorder"])
    assert result.check == "reorder" and result.key == "sdpa-math:reorder" and result.is_complete, result.line()
    assert "sdpa-math reorder: ok" in result.line()


def _count_worker_starts(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """One entry for every worker process started from now on (``Worker._launch``): the worker's id."""
    starts: list[int] = []
    real = Worker._launch

    def counted(self):  # type: ignore[no-untyped-def]
        starts.append(id(self))
        return real(self)

    monkeypatch.setattr(Worker, "_launch", counted)
    return starts


def test_every_backend_and_check_of_a_campaign_shares_one_worker_per_device(tmp_path: Path, monkeypatch) -> None:
    starts = _count_worker_starts(monkeypatch)
    backends = [UserKernel.from_spec(CORRECT), get_backend("sdpa-math")]
    backends[0].capabilities = backends[0].capabilities.replace(storages=("contiguous",))  # its 3 cases as before views by default
    results = run_campaign(backends, CampaignState({"seed": 0}), tmp_path / "checks.json", CampaignConfig(examples=3, limits=TINY, isolate=True, case_timeout=120, checks=(ORACLE, CHECKS["reorder"])))
    assert [(r.backend, r.check) for r in results] == [(b.name, c) for b in backends for c in ("oracle", "reorder")]
    assert all(r.is_complete and r.examples == 3 for r in results), [r.line() for r in results]
    assert len(starts) == 1, "one process served both backends and both checks"
    first = results[0]
    assert first.start_seconds > 0 and first.judge_seconds > 0, "the first pair paid the start, and the split says so"
    assert all(r.start_seconds < first.start_seconds for r in results[1:]), [r.time_split() for r in results]


def test_a_kept_output_round_trips_bit_for_bit(tmp_path: Path) -> None:
    from pa_oracle.backends.base import KernelOutput
    from pa_oracle.fuzz.campaign.findings import save_output

    out = torch.randn(3, 2, 8).to(torch.bfloat16)
    out[0, 0, 0] = float("nan")
    for lse in (torch.randn(3, 2), None):
        kept = load_output(save_output(KernelOutput(out, lse), tmp_path / "output.npz"))
        assert kept.out.dtype == torch.bfloat16 and torch.equal(kept.out.view(torch.int16), out.view(torch.int16))
        assert (kept.lse is None and lse is None) or torch.equal(kept.lse, lse)


def test_a_pair_that_overruns_its_share_shortens_the_others_evenly_never_to_nothing(tmp_path: Path, monkeypatch) -> None:
    import time as clock

    from pa_oracle.fuzz.campaign import engine

    turns: list[tuple[str, float]] = []

    def fake(backend, config, *, resume, shared, **_):  # type: ignore[no-untyped-def]
        now, deadline = clock.monotonic(), shared.deadline
        turns.append((backend.name, deadline - now))
        clock.sleep(max(deadline - now, 0) + (1.0 if backend.name == "sdpa-math" else 0.0))  # the first overruns by 1 s
        resume.examples, resume.passed, resume.status = resume.examples + 1, resume.passed + 1, "running"
        return resume

    monkeypatch.setattr(engine, "fuzz_backend", fake)
    backends = [get_backend(n) for n in ("sdpa-math", "sdpa-efficient", "flex")]
    run_campaign(backends, CampaignState({"seed": 0}), tmp_path / "c.json", CampaignConfig(examples=100, limits=TINY, time_budget=3.0))
    first_turn = turns[:3]
    assert [name for name, _ in first_turn] == ["sdpa-math", "sdpa-efficient", "flex"], turns
    shares = [share for _, share in first_turn]
    assert abs(shares[0] - 1.0) < 0.2, shares
    assert abs(shares[1] - shares[2]) < 0.2 and shares[2] > 0.3, f"the overrun is shared, not taken from the last: {shares}"


def test_turns_that_end_at_their_deadline_keep_the_shared_worker_running(tmp_path: Path, monkeypatch) -> None:
    """A turn ends between two cases (or lets its last case finish): the worker is neither cut nor restarted.

    The budget is made from what this machine takes now (a loaded machine starts a worker in 15 s, not 3):
    each pair's first turn (half of it) holds a worker start and several cases of both kernels."""
    import time as clock

    first = "tests.reliability.bad_kernels:slow_correct"  # 0.05 s of sleep a case; the other sleeps 2 s
    probe = IsolatedBackend(UserKernel.from_spec(first), first, timeout=60)
    try:
        began = clock.monotonic()
        probe._start()
        start = clock.monotonic() - began  # spawn, imports, loading the kernel
        began = clock.monotonic()
        assert probe.check(CASE).status == "pass"
        case = clock.monotonic() - began  # one case of slow_correct, judged and answered
    finally:
        probe.close()
    # either half: a start (half as long again: the load can change), 4 slow cases and two 2-s cases
    budget = 2 * (1.5 * start + 4 * case + 2 * (2.0 + case))
    starts = _count_worker_starts(monkeypatch)
    slow = [UserKernel.from_spec(f"tests.reliability.bad_kernels:{n}") for n in ("slow_correct", "sleeps_two_seconds")]
    results = run_campaign(slow, CampaignState({"seed": 0}), tmp_path / "c.json", CampaignConfig(examples=10_000, limits=TINY, isolate=True, case_timeout=60, time_budget=budget))
    assert all(r.passed > 0 and r.status == "running" for r in results), (budget, [r.line() for r in results])
    assert len(starts) == 1, f"the worker started {len(starts)} times"
    assert results[0].notes == [], "the first turn's last case finished (only the campaign's end cuts a case)"
