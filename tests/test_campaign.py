from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pa_oracle.fuzz.campaign.engine
import pytest
from click.testing import CliRunner
from pa_oracle.backends import get_backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.engine import CampaignConfig, run_campaign
from pa_oracle.fuzz.campaign.ledger import load_ledger
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.fuzz.campaign.state import CampaignState, CampaignStateError, state_path
from pa_oracle.fuzz.draw.strategies import Limits
from pa_oracle.fuzz.quality.planted import correct_attention

from pa_oracle.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = Limits(max_batch=2, max_kv_len=12, max_qo_len=4, max_kv_heads=2, max_qo_heads=8, head_dims=(8, 16))
TINY_ARGS = ["--max-batch", "2", "--max-kv-len", "12"]
GQA_BUG = "pa_oracle.fuzz.quality.planted:wrong_gqa_map"
_calls = {"n": 0}


def interrupted_at_call_12(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal,  # type: ignore[no-untyped-def]
                           sm_scale, window_left, logits_soft_cap):
    """A correct kernel whose 12th call is the user's Ctrl-C (a real SIGINT: it passes through the
    judge, unlike a KeyboardInterrupt the kernel raises itself)."""
    _calls["n"] += 1
    if _calls["n"] == 12:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler raises KeyboardInterrupt before this ends
    return correct_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                             kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                             window_left=window_left, logits_soft_cap=logits_soft_cap)


def campaign(tmp_path: Path, backend, examples: int, *, resume: bool = False, **kwargs) -> CampaignState:  # type: ignore[no-untyped-def]
    path = state_path(tmp_path, Shard())
    state = CampaignState.load(path) if resume else CampaignState({"seed": 3})
    run_campaign([backend], state, path, CampaignConfig(examples=examples, limits=TINY, out_dir=tmp_path, **kwargs))
    return CampaignState.load(path)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pa_oracle.fuzz.campaign.engine, "CHUNK", 5)


def test_a_killed_campaign_resumes_at_the_next_chunk_and_draws_what_an_unbroken_one_draws(tmp_path, small_chunks) -> None:
    spec = "tests.test_campaign:interrupted_at_call_12"
    _calls["n"] = 0
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's Python has it
    try:
        with pytest.raises(KeyboardInterrupt):  # in this process: the call counter is this process's
            campaign(tmp_path / "broken", UserKernel.from_spec(spec), 15, isolate=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    killed = CampaignState.load(tmp_path / "broken" / "campaign.json").results[spec]
    assert (killed.chunks_done, killed.examples, len(killed.seen)) == (2, 10, 10), "the state is that of the last whole chunk"
    resumed = campaign(tmp_path / "broken", UserKernel.from_spec(spec), 15, resume=True, isolate=False).results[spec]
    assert (resumed.chunks_done, resumed.examples, resumed.passed) == (3, 15, 15)
    assert resumed.seen[:10] == killed.seen and len(set(resumed.seen)) == 15, "an example ran twice"
    _calls["n"] = -1000
    unbroken = campaign(tmp_path / "unbroken", UserKernel.from_spec(spec), 15, isolate=False).results[spec]
    assert unbroken.seen == resumed.seen
    assert resumed.coverage.counts == unbroken.coverage.counts


def test_no_case_runs_twice_although_every_hypothesis_run_starts_at_the_simplest_case(tmp_path, small_chunks) -> None:
    result = campaign(tmp_path, get_backend("sdpa-math"), 20).results["sdpa-math"]
    assert result.chunks_done == 4 and result.examples == 20
    assert len(set(result.seen)) == len(result.seen) == 20


def test_a_backend_with_a_finding_is_not_rerun_on_resume_unless_asked(tmp_path) -> None:
    first = campaign(tmp_path, UserKernel.from_spec(GQA_BUG), 30).results[GQA_BUG]
    assert first.status == "finding" and len(first.findings) == 1 and first.examples < 30
    saved = Path(first.findings[0].dir)
    assert {p.name for p in saved.iterdir()} - {"original.json", "original.npz"} == {"case.json", "tensors.npz", "report.md", "output.npz"}
    assert not list(saved.parent.glob(".*")), "a temp folder was left behind"
    again = campaign(tmp_path, UserKernel.from_spec(GQA_BUG), 30, resume=True).results[GQA_BUG]
    assert (again.examples, again.chunks_done, again.findings) == (first.examples, first.chunks_done, first.findings)
    known = load_ledger(ledger_for(tmp_path, GQA_BUG, {"group_size": [2, 3, 4, 5, 6, 7, 8, 16, 32]}))
    rerun = campaign(tmp_path, UserKernel.from_spec(GQA_BUG), 30, resume=True, rerun_findings=True, ledger=known).results[GQA_BUG]
    assert rerun.status == "done" and rerun.examples == 30 and rerun.findings == first.findings, rerun.line()
    assert len(set(rerun.seen)) == len(rerun.seen)


def ledger_for(tmp_path: Path, backend: str, matches: dict) -> Path:  # type: ignore[type-arg]
    entry = {"case": "c", "backends": [backend], "status": "tolerated", "reason": "r", "issue": "https://x/1", "matches": matches}
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps({"schema_version": 1, "entries": [entry]}))
    return path


def test_cases_a_ledger_predicate_covers_are_skipped_and_counted(tmp_path) -> None:
    grouped = ledger_for(tmp_path, GQA_BUG, {"group_size": [2, 3, 4, 5, 6, 7, 8, 16, 32]})
    skipping = campaign(tmp_path / "skip", UserKernel.from_spec(GQA_BUG), 30, ledger=load_ledger(grouped)).results[GQA_BUG]
    assert not skipping.findings and skipping.examples == 30, skipping.line()
    assert skipping.skipped_known > 0 and skipping.coverage.counts["group_size"] == {"1": 30}
    assert len(set(skipping.seen)) == len(skipping.seen) == 30 + skipping.skipped_known


def test_cli_fuzz_skips_known_cases_reports_them_and_no_skip_known_finds_them(tmp_path) -> None:
    grouped = ledger_for(tmp_path, GQA_BUG, {"group_size": [2, 3, 4, 5, 6, 7, 8, 16, 32]})
    args = ["fuzz", "-k", GQA_BUG, "-n", "20", *TINY_ARGS, "--ledger", str(grouped), "--json"]
    skipped = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a")])
    assert skipped.exit_code == 0, skipped.output
    (summary,) = json.loads(skipped.stdout)
    assert summary["skipped_known"] > 0 and summary["findings"] == [] and summary["examples"] == 20
    assert summary["coverage"]["missing"]["group_size"][0] == "2"
    found = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b"), "--no-skip-known"])
    assert found.exit_code == 1, found.output
    assert json.loads(found.stdout)[0]["finding"]["status"] == "fail"


def test_cli_resume_refuses_a_different_seed_and_a_missing_state(tmp_path) -> None:
    CampaignState({"seed": 3, "max_batch": 2, "max_kv_len": 12, "only": [], "backends": ["sdpa-math"], "kernels": [], "shard": "0/1"}).save(tmp_path / "campaign.json")
    result = CliRunner().invoke(main, ["fuzz", "--out", str(tmp_path), "--resume", "--seed", "4"])
    assert result.exit_code == 2 and "started with seed=3, not 4" in result.output
    result = CliRunner().invoke(main, ["fuzz", "--out", str(tmp_path / "empty"), "--resume"])
    assert result.exit_code == 2 and "no campaign state to resume" in result.output


def test_a_malformed_state_file_is_refused_with_the_reason(tmp_path) -> None:
    (tmp_path / "campaign.json").write_text(json.dumps({"schema_version": 9, "config": {}, "backends": {}}))
    with pytest.raises(CampaignStateError, match="unknown campaign schema_version 9"):
        CampaignState.load(tmp_path / "campaign.json")
    (tmp_path / "campaign.json").write_text(json.dumps({"schema_version": 1, "config": {}, "backends": {"x": {"bogus": 1}}}))
    with pytest.raises(CampaignStateError, match="malformed campaign state"):
        CampaignState.load(tmp_path / "campaign.json")


def test_sigkill_mid_campaign_then_resume_adds_up(tmp_path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "pa_oracle", "fuzz", "-b", "sdpa-math", "-n", "1000", "--seed", "5", *TINY_ARGS, "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state_file, deadline = out / "campaign.json", time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if state_file.exists() and CampaignState.load(state_file).results["sdpa-math"].chunks_done >= 1:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the campaign wrote no state after a chunk in 120 s")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    killed = CampaignState.load(state_file).results["sdpa-math"]
    assert killed.status == "running" and killed.examples == 25 * killed.chunks_done
    target = killed.examples + 5
    result = CliRunner().invoke(main, ["fuzz", "--out", str(out), "--resume", "-n", str(target), "--json"])
    assert result.exit_code == 0, result.output
    (summary,) = json.loads(result.stdout)
    assert summary["examples"] == summary["passed"] == target and summary["chunks"] == killed.chunks_done + 1
    resumed = CampaignState.load(state_file).results["sdpa-math"]
    assert resumed.seen[: len(killed.seen)] == killed.seen and len(set(resumed.seen)) == len(resumed.seen) == target


def test_the_worst_ratio_counts_only_passes_whose_control_had_an_error() -> None:
    """A pass whose control was exact (one key: the output is V) has kernel/control ratio inf: within
    the floor, it says nothing of the kernel's headroom, and inf is not JSON."""
    from pa_oracle.fuzz.campaign.tally import count as _count
    from pa_oracle.fuzz.campaign.state import BackendResult
    from pa_oracle.fuzz.run.runner import Outcome
    from pa_oracle.oracle.case import Case, Heads, Layout
    from pa_oracle.oracle.tolerance import ErrorStats, Verdict

    case = Case(Layout.from_lengths([1], [1], 4), Heads(1, 1, 8, 8))

    def passing(error: float, control: float) -> Outcome:
        stats = ErrorStats("out", error, error, control, control, 1e-3, 8, 0, 2 * control + 1e-3, 2 * control + 1e-3)
        return Outcome(case, "k", "pass", "PASS", Verdict(True, [], stats))

    result = BackendResult("k")
    _count(result, passing(4e-4, 0.0))
    assert result.worst_ratio == 0.0 and passing(4e-4, 0.0).verdict.out.ratio == float("inf")
    _count(result, passing(3e-4, 2e-4))
    assert result.worst_ratio == pytest.approx(1.5)
    assert json.loads(json.dumps(result.worst_ratio)) == pytest.approx(1.5)
