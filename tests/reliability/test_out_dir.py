"""Nothing under --out is ever lost (``pa_oracle.fuzz.campaign.outdir``): one campaign at a time, no fresh campaign
over a kept one without --resume/--overwrite, finding folders published whole and never replaced,
and a finding that cannot be written stops the campaign with exit 3 and says where it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.engine import save_finding
from pa_oracle.fuzz.campaign.finding_record import read_meta
from pa_oracle.fuzz.campaign.outdir import campaign_lock, publish_folder
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.fuzz.campaign.state import CampaignState
from pa_oracle.fuzz.exits import BAD_INPUT, FINDING, NO_FINDING, TOOL_FAILED
from pa_oracle.fuzz.quality.planted import correct_attention
from pa_oracle.fuzz.run.runner import Outcome
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.tensors import load_case

from pa_oracle.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--max-batch", "2", "--max-kv-len", "12"]
GQA_BUG = "pa_oracle.fuzz.quality.planted:wrong_gqa_map"
SLOW = "tests.reliability.test_out_dir:slow_correct"
LOCK = {".pa-oracle.lock", ".pa-oracle.lock.owner"}  # who holds --out: rewritten by every run
KEPT_BY_A_RUN = {"campaign.json", "summary.json", *LOCK}  # the state a new run rewrites


def slow_correct(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal,  # type: ignore[no-untyped-def]
                 sm_scale, window_left, logits_soft_cap):
    """A correct kernel that takes 0.2 s a case, so that a campaign is still running when looked at."""
    time.sleep(0.2)
    return correct_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                             kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                             window_left=window_left, logits_soft_cap=logits_soft_cap)


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def tree(folder: Path, skip: set[str] = frozenset()) -> dict[str, bytes]:  # type: ignore[assignment]
    """Every file under ``folder`` (relative path -> bytes), less top-level names in ``skip``."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.relative_to(folder).parts[0] not in skip}


def finding_dirs(out: Path) -> list[Path]:
    return sorted(p.parent for p in out.glob("*/*/case.json"))


def spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "pa_oracle", "fuzz", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_for(condition, what: str, proc: subprocess.Popen[bytes], seconds: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            pytest.fail(f"the campaign ended (exit {proc.returncode}) before {what}: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    pytest.fail(f"no {what} after {seconds} s")


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture
def found(tmp_path) -> Path:
    """An --out with one finding folder, a user's notes and triage report in it, and a user file beside."""
    out = tmp_path / "out"
    result = cli("fuzz", "-k", GQA_BUG, "-n", "30", *TINY, "--out", str(out))
    assert result.exit_code == FINDING, result.output
    (folder,) = finding_dirs(out)
    (folder / "notes.txt").write_text("seen on the H200 too\n")
    (folder / "triage").mkdir()
    (folder / "triage" / "triage.md").write_text("# triage\n")
    (out / "mine.txt").write_text("the user's own file\n")
    return out


def test_a_fresh_run_into_a_kept_campaign_is_refused_and_changes_nothing(found) -> None:
    before = tree(found, LOCK)
    result = cli("fuzz", "-k", GQA_BUG, "-n", "30", *TINY, "--out", str(found))
    assert result.exit_code == BAD_INPUT, result.output
    assert f"{found} holds a campaign (campaign.json, summary.json): --resume continues it, --overwrite starts" in result.output
    assert tree(found, LOCK) == before


def test_overwrite_starts_anew_but_keeps_every_finding_folder_and_user_file(found) -> None:
    before, folders = tree(found, KEPT_BY_A_RUN), finding_dirs(found)
    result = cli("fuzz", "-k", GQA_BUG, "-n", "30", *TINY, "--out", str(found), "--overwrite", "--json")
    assert result.exit_code == FINDING, result.output
    assert tree(found, KEPT_BY_A_RUN) == before, "a file under --out was changed or deleted"
    assert finding_dirs(found) == folders, "the same finding found again is left as it was, not copied"
    (summary,) = json.loads(result.stdout)
    assert summary["finding"]["dir"] == str(folders[0])
    assert CampaignState.load(found / "campaign.json").results[GQA_BUG].chunks_done >= 1


def test_the_same_case_with_another_verdict_is_saved_beside_never_over(tmp_path) -> None:
    backend = UserKernel.from_spec(GQA_BUG)
    case = Case(Layout((0, 2), (0, 1), (0,), (3,), 4, 1), Heads(4, 2, 16, 16), Options(causal=True), seed=2)
    first = save_finding(Outcome(case, backend.name, "fail", "out: 3 elements off"), backend, tmp_path)
    (first / "notes.txt").write_text("mine")
    kept = tree(first)
    again = save_finding(Outcome(case, backend.name, "fail", "out: 3 elements off"), backend, tmp_path)
    other = save_finding(Outcome(case, backend.name, "crash", "RuntimeError: illegal memory access"), backend, tmp_path)
    assert again == first and other == first.with_name(first.name + "-2") and tree(first) == kept
    assert read_meta(json.loads((other / "case.json").read_text())["meta"], other).found_by.status == "crash"  # type: ignore[union-attr]
    assert f"{other}/case.json" in (other / "report.md").read_text(), "the repro names the folder it is in"
    assert not list(first.parent.glob(".*")), "a temp folder was left behind"


def test_a_folder_is_published_whole_or_not_at_all(tmp_path) -> None:
    (tmp_path / "abc").mkdir()
    (tmp_path / "abc" / "old.txt").write_text("old")

    def failing(tmp: Path, final: Path) -> None:
        (tmp / "half.txt").write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        publish_folder(tmp_path, "abc", failing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abc"] and (tmp_path / "abc" / "old.txt").read_text() == "old"
    made = publish_folder(tmp_path, "abc", lambda tmp, final: (tmp / "new.txt").write_text(str(final)))
    assert made == tmp_path / "abc-2" and (made / "new.txt").read_text() == str(made)


KILLED_WRITER = """
import sys, time
from pathlib import Path
from pa_oracle.fuzz.campaign.outdir import publish_folder

def write(tmp, final):
    (tmp / "case.json").write_text("new")
    print("writing", flush=True)
    time.sleep(60)

publish_folder(Path(sys.argv[1]), "abc", write)
"""


def test_a_kill_while_a_finding_folder_is_written_leaves_the_old_one_in_place(tmp_path) -> None:
    (tmp_path / "abc").mkdir()
    (tmp_path / "abc" / "case.json").write_text("old")
    (tmp_path / "abc" / "notes.txt").write_text("mine")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"writing\n"
    finally:
        kill(proc)
    assert tree(tmp_path / "abc") == {"case.json": b"old", "notes.txt": b"mine"}
    (left,) = [p for p in tmp_path.iterdir() if p.name != "abc"]
    assert left.name.startswith(".abc.") and left.name.endswith(".tmp"), "only a hidden temp folder of the new one"


def test_a_second_campaign_on_the_same_out_is_refused_while_the_first_runs(tmp_path) -> None:
    out = tmp_path / "out"
    first = spawn("-k", SLOW, "-n", "1000", *TINY, "--out", str(out))
    try:
        owner = out / ".pa-oracle.lock.owner"
        wait_for(lambda: owner.is_file() and f"pid {first.pid} " in owner.read_text(), "lock owner file", first)
        for args in ([], ["--resume"], ["--overwrite"]):
            second = cli("fuzz", "-b", "sdpa-math", "-n", "2", *TINY, "--out", str(out), *args)
            assert second.exit_code == BAD_INPUT, second.output
            assert f"{out} is in use by another campaign (pid {first.pid} on " in second.output
        meta = cli("metamorphic", "-b", "sdpa-math", "-n", "1", "--out", str(out))
        assert meta.exit_code == BAD_INPUT and "in use by another campaign" in meta.output
        assert first.poll() is None, "the first campaign was disturbed"
    finally:
        kill(first)


def test_shards_lock_their_own_state_so_workers_run_under_their_parent(tmp_path) -> None:
    with campaign_lock(tmp_path):  # as a --workers parent holds it
        shard = cli("fuzz", "-b", "sdpa-math", "-n", "40", *TINY, "--shard", "1/2", "--out", str(tmp_path))  # (a run of one
        # case may attend no key: judged nothing, exit 3)
        assert shard.exit_code == NO_FINDING, shard.output
        whole = cli("fuzz", "-b", "sdpa-math", "-n", "2", *TINY, "--out", str(tmp_path))
        assert whole.exit_code == BAD_INPUT and "in use by another campaign" in whole.output
    with campaign_lock(tmp_path, Shard(0, 2)):
        same = cli("fuzz", "-b", "sdpa-math", "-n", "2", *TINY, "--shard", "0/2", "--out", str(tmp_path))
        assert same.exit_code == BAD_INPUT and "shard 0/2 of the campaign" in same.output
    again = cli("fuzz", "-b", "sdpa-math", "-n", "2", *TINY, "--shard", "1/2", "--out", str(tmp_path))
    assert again.exit_code == BAD_INPUT and "shards/campaign-1-of-2.json" in again.output
    workers = cli("fuzz", "-b", "sdpa-math", "-n", "2", *TINY, "--workers", "2", "--out", str(tmp_path))
    assert workers.exit_code == BAD_INPUT and "holds a campaign (" in workers.output and "shards/campaign-1-of-2.json" in workers.output


def test_sigkill_then_resume_loses_no_finding(tmp_path) -> None:
    out = tmp_path / "out"
    proc = spawn("-k", GQA_BUG, "-k", SLOW, "-n", "1000", *TINY, "--out", str(out))
    state = out / "campaign.json"

    def found_and_moved_on() -> bool:
        try:
            results = CampaignState.load(state).results
        except Exception:  # noqa: BLE001 - not written yet
            return False
        return results[GQA_BUG].status == "finding" and results[SLOW].status == "pending"

    try:
        wait_for(found_and_moved_on, "finding saved in the state", proc)
        time.sleep(0.5)  # SIGKILL while the slow kernel runs its first chunk
    finally:
        kill(proc)
    (folder,) = finding_dirs(out)
    saved = tree(folder)
    resumed = cli("fuzz", "--out", str(out), "--resume", "-n", "3", "--json")
    assert resumed.exit_code == FINDING, resumed.output
    by_backend = {r["backend"]: r for r in json.loads(resumed.stdout)}
    assert by_backend[GQA_BUG]["finding"]["dir"] == str(folder) and by_backend[SLOW]["examples"] == 3
    assert finding_dirs(out) == [folder] and tree(folder) == saved
    assert load_case(folder / "case.json").case_id, "the saved case loads"
    assert cli("replay", str(folder / "case.json"), "--kernel", GQA_BUG).exit_code == FINDING


def test_a_finding_that_cannot_be_saved_stops_with_exit_3_and_is_rescued(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    blocked = out / "pa_oracle.fuzz.quality.planted_wrong_gqa_map"
    blocked.write_text("a file where the backend's finding folder would go")
    result = cli("fuzz", "-k", GQA_BUG, "-n", "30", *TINY, "--out", str(out))
    assert result.exit_code == TOOL_FAILED, result.output
    assert f"could not save a finding in {blocked}" in result.output
    assert f"finding: {GQA_BUG} fail: " in result.output and "case B=" in result.output
    rescued = Path(result.output.split("its case.json was written to ", 1)[1].split()[0])
    assert cli("replay", str(rescued), "-k", GQA_BUG).exit_code == FINDING, "the rescued case reproduces the finding"
    assert blocked.read_text().startswith("a file where"), "the blocking file was left alone"


def test_unwritable_summary_and_state_exit_3_naming_the_path(tmp_path) -> None:
    out = tmp_path / "out"
    (out / "summary.json" / "x").mkdir(parents=True)  # a folder (not empty) where the file goes
    result = cli("fuzz", "-b", "sdpa-math", "-n", "2", *TINY, "--out", str(out))
    assert result.exit_code == TOOL_FAILED and "I/O error" in result.output and "summary.json" in result.output, result.output
    (out / "campaign.json").unlink()
    (out / "campaign.json" / "x").mkdir(parents=True)
    result = cli("fuzz", "-b", "sdpa-math", "-n", "2", *TINY, "--out", str(out), "--overwrite")
    assert result.exit_code == TOOL_FAILED and "campaign.json" in result.output, result.output
    (tmp_path / "file").write_text("")
    result = cli("metamorphic", "-b", "sdpa-math", "-n", "1", "--out", str(tmp_path / "file" / "sub"))
    assert result.exit_code == TOOL_FAILED and str(tmp_path / "file") in result.output, result.output
