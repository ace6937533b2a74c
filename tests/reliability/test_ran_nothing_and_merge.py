"""A campaign that judged nothing is no verdict (exit 3, the reason said), and ``--merge`` takes shard
states only as one campaign's: a missing shard is exit 3 naming it, states that cannot be one
campaign's are exit 2 naming the file and field (issue 31)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from hypothesis import given, settings
from pa_oracle.backends import get_backend
from pa_oracle.fuzz.campaign.coverage import declared
from pa_oracle.fuzz.campaign.tally import attends_a_key
from pa_oracle.fuzz.campaign.shard import MAX_SHARDS, Shard
from pa_oracle.fuzz.campaign.state import (
    UNSUPPORTED_BOUND,
    UNSUPPORTED_MIN,
    BackendResult,
    CampaignState,
    FindingRecord,
    state_path,
)
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.exits import BAD_INPUT, FINDING, NO_FINDING, TOOL_FAILED, campaign_exit_code
from pa_oracle.oracle.visibility import attended

from pa_oracle.cli import main
from tests.reliability.bad_kernels import correct

HERE = "tests.reliability.test_ran_nothing_and_merge"
TINY = ["--max-batch", "2", "--max-kv-len", "12"]
TRACEBACK = "Traceback (most recent call last)"


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def assert_clean(result: Result, code: int, *says: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert TRACEBACK not in result.output, result.output
    for text in says:
        assert text in result.output, result.output


def _attends(qo_indptr, kv_indptr) -> bool:  # type: ignore[no-untyped-def]
    """Some request has a query and a page (a page holds at least one key): non-causal, it attends a key."""
    qo, pages = torch.diff(qo_indptr.cpu()), torch.diff(kv_indptr.cpu())
    return bool(((qo > 0) & (pages > 0)).any())


def declines_every_real_case(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """The issue's kernel: it declines every case that attends a key, and passes the others (all zeros)."""
    if _attends(qo_indptr, kv_indptr):
        raise NotImplementedError("declined")
    return correct(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                   kv_last_page_len=kv_last_page_len)


# --- "ran nothing" is not "ok" -------------------------------------------------------------------


def test_a_kernel_that_declines_every_real_case_is_incomplete_not_ok(tmp_path: Path) -> None:
    result = cli("fuzz", "-k", f"{HERE}:declines_every_real_case", "-n", "40", *TINY, "--out", str(tmp_path), "--json")
    [summary] = json.loads(result.stdout)
    judged = summary["examples"] - summary["unsupported"]
    assert summary["unsupported"] > 0 and judged > 0, summary  # it did pass cases: those without a key
    assert_clean(result, TOOL_FAILED, "judged nothing: every judged case attended no key",
                 f"({judged} such case(s), {summary['unsupported']} unsupported of {summary['examples']})")
    state = CampaignState.load(tmp_path / "campaign.json").results[f"{HERE}:declines_every_real_case"]
    assert state.no_keys == judged and not state.is_complete and "INCOMPLETE (every judged case attended no key" in state.line()


def declines_nearly_every_real_case(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Takes a case with a key only when a hash of its q says so (1 in 20), else declines it."""
    if _attends(qo_indptr, kv_indptr) and hashlib.sha256(q.cpu().float().numpy().tobytes()).digest()[0] >= 13:
        raise NotImplementedError("declined")
    return correct(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                   kv_last_page_len=kv_last_page_len)


def test_a_kernel_that_declines_nearly_every_real_case_is_incomplete_not_ok(tmp_path: Path) -> None:
    result = cli("fuzz", "-k", f"{HERE}:declines_nearly_every_real_case", "-n", "80", *TINY, "--out", str(tmp_path), "--json")
    [summary] = json.loads(result.stdout)
    state = CampaignState.load(tmp_path / "campaign.json").results[f"{HERE}:declines_nearly_every_real_case"]
    real = summary["examples"] - state.no_keys
    assert summary["examples"] - summary["unsupported"] > state.no_keys > 0, (summary, state.no_keys)  # some real case passed
    assert_clean(result, TOOL_FAILED, f"judged nothing: {summary['unsupported']} of {real} examples were unsupported (more than 90%")


def test_the_correct_twin_with_the_same_draws_is_ok(tmp_path: Path) -> None:
    result = cli("fuzz", "-k", "tests.reliability.bad_kernels:correct", "-n", "40", *TINY, "--out", str(tmp_path), "--json")
    assert_clean(result, NO_FINDING)
    [summary] = json.loads(result.stdout)
    assert summary["passed"] == 40 and summary["unsupported"] == 0, summary


def counted(examples: int, unsupported: int, no_keys: int = 0, check: str = "oracle", status: str = "done",
            finding: bool = False) -> BackendResult:
    found = [FindingRecord("id", "fail", "m", "case", None, None)] if finding else []
    return BackendResult("k", examples=examples, passed=examples - unsupported - finding, unsupported=unsupported,
                         no_keys=no_keys, check=check, status=status, findings=found)  # type: ignore[arg-type]


@pytest.mark.parametrize("result, code, says", [
    (counted(20, 19), TOOL_FAILED, "19 of 20 examples were unsupported (more than 90%)"),
    (counted(100, 91), TOOL_FAILED, "91 of 100 examples were unsupported"),
    (counted(20, 18), NO_FINDING, ""),  # 90% is not above the bound
    (counted(19, 18), NO_FINDING, ""),  # too few examples to judge a share
    (counted(20, 19, check="reorder"), NO_FINDING, ""),  # a check skips what it cannot apply to: no bound
    (counted(20, 19, status="running"), TOOL_FAILED, "more than 90%"),  # the time budget's end: judged all the same
    (counted(30, 19, no_keys=9), TOOL_FAILED, "19 of 21 examples were unsupported (more than 90%, besides 9 judged without"),
    (counted(30, 18, no_keys=9), NO_FINDING, ""),  # 18 of 21: not above the bound
    (counted(28, 18, no_keys=9), NO_FINDING, ""),  # 19 examples besides the empty ones: too few
    (counted(10, 4, no_keys=6), TOOL_FAILED, "every judged case attended no key (6 such case(s), 4 unsupported of 10)"),
    (counted(10, 4, no_keys=6, check="reorder"), TOOL_FAILED, "every judged case attended no key"),
    (counted(10, 4, no_keys=5), NO_FINDING, ""),  # one real case judged
    (counted(10, 10), TOOL_FAILED, "all 10 examples were unsupported"),
    (counted(20, 19, finding=True, status="finding"), FINDING, ""),  # a finding is a verdict
])
def test_the_bound_on_unsupported_cases_and_cases_without_keys(result: BackendResult, code: int, says: str) -> None:
    assert (UNSUPPORTED_BOUND, UNSUPPORTED_MIN) == (0.9, 20)  # as the docstrings and exits.py say
    got, why = campaign_exit_code([result])
    assert got == code and says in " ".join(why), (got, why)
    assert result.is_complete == (code != TOOL_FAILED)
    assert ("INCOMPLETE" in result.line()) == (code == TOOL_FAILED) and says in result.line(), result.line()


def test_merged_shards_are_judged_on_their_sum() -> None:
    """Each shard under the bound's minimum, together above it: the merge is incomplete."""
    from pa_oracle.fuzz.campaign.state import merge_results

    (merged,) = merge_results([[counted(10, 10 - (i == 0))] for i in range(3)])
    assert (merged.examples, merged.unsupported) == (30, 29)
    assert campaign_exit_code([merged], may_be_empty=True)[0] == TOOL_FAILED


@settings(max_examples=300, deadline=None, database=None)
@given(cases(limits=Limits(max_batch=3, max_kv_len=12)))
def test_attends_a_key_agrees_with_the_oracle_s_visibility(case) -> None:  # type: ignore[no-untyped-def]
    assert attends_a_key(case) == any(rows.any() for rows in attended(case))


# --- --merge ------------------------------------------------------------------------------------------

CONFIG = {"seed": 3, "max_batch": 2, "max_kv_len": 12, "only": [], "backends": ["sdpa-math"], "kernels": []}


def shard_state(out: Path, index: int, count: int, ids: list[str], **config: object) -> Path:
    result = BackendResult("sdpa-math", examples=len(ids), passed=len(ids), chunks_done=1, status="done", seen=ids,
                           declared=declared(get_backend("sdpa-math").capabilities, Limits(max_batch=2, max_kv_len=12)))
    path = state_path(out, Shard(index, count))
    CampaignState({**CONFIG, "shard": f"{index}/{count}", **config}, {"sdpa-math": result}).save(path)
    return path


@pytest.fixture
def three(tmp_path: Path) -> Path:
    for i in range(3):
        shard_state(tmp_path, i, 3, [f"{i}a", f"{i}b"])
    return tmp_path


def merge(out: Path) -> Result:
    return cli("fuzz", "--merge", "--out", str(out))


def test_a_whole_campaign_merges_with_exit_0(three: Path) -> None:
    assert_clean(merge(three), NO_FINDING, "sdpa-math: ok, 6 examples (6 passed")


def test_a_missing_shard_is_exit_3_naming_it(three: Path) -> None:
    (three / "shards" / "campaign-1-of-3.json").unlink()
    assert_clean(merge(three), TOOL_FAILED, "INCOMPLETE (merged without shard(s) 1/3 (1 of 3",
                 "sdpa-math stopped early (incomplete) after 4 examples: merged without shard(s) 1/3")


def test_a_missing_shard_wins_over_a_finding(three: Path) -> None:
    result = BackendResult("sdpa-math", examples=2, passed=1, status="finding", seen=["0a", "0b"],
                           declared=declared(get_backend("sdpa-math").capabilities, Limits(max_batch=2, max_kv_len=12)),
                           findings=[FindingRecord("0b", "fail", "out differs", "B=1", None, None)])
    CampaignState({**CONFIG, "shard": "0/3"}, {"sdpa-math": result}).save(state_path(three, Shard(0, 3)))
    (three / "shards" / "campaign-2-of-3.json").unlink()
    assert_clean(merge(three), TOOL_FAILED, "merged without shard(s) 2/3", "FINDING in sdpa-math: out differs")


def _copy(src: Path, dst: Path, edit=None) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(src.read_text())
    if edit:
        edit(data)
    dst.write_text(json.dumps(data))


HOSTILE_MERGES = [
    # (what is done to a whole 3-shard campaign, the file the message names, what it says)
    (lambda d: shutil.copy(d / "campaign-0-of-3.json", d / "campaign-00-of-3.json"),
     "campaign-00-of-3.json", "shard 0/3 again (it is campaign-0-of-3.json's): a shard is merged once"),
    (lambda d: _copy(d / "campaign-0-of-3.json", d / "campaign-1-of-3.json"),
     "campaign-1-of-3.json", "config.shard: '0/3', but campaign-1-of-3.json holds shard 1/3's state"),
    (lambda d: _copy(d / "campaign-0-of-3.json", d / "campaign-1-of-3.json", lambda s: s["config"].pop("shard")),
     "campaign-1-of-3.json", "config.shard is None, but the file is shard 1/3's"),
    (lambda d: _copy(d / "campaign-0-of-3.json", d / "campaign-1-of-3.json", lambda s: s["config"].update(shard="1/3")),
     "campaign-1-of-3.json", "backends.sdpa-math.seen: case 0a was drawn by campaign-0-of-3.json too"),
    (lambda d: _copy(d / "campaign-2-of-3.json", d / "campaign-2-of-3.json", lambda s: s["config"].update(seed=4)),
     "campaign-2-of-3.json", "config.seed is 4, but 3 in campaign-0-of-3.json"),
    (lambda d: _copy(d / "campaign-1-of-3.json", d / "campaign-1-of-3.json", lambda s: s["config"].update(kernels=["m:f"])),
     "campaign-1-of-3.json", "config.kernels is ['m:f'], but [] in campaign-0-of-3.json"),
    (lambda d: _copy(d / "campaign-1-of-3.json", d / "campaign-1-of-3.json", lambda s: s["config"].update(backends=["flex"])),
     "campaign-1-of-3.json", "config.backends is ['flex'], but ['sdpa-math']"),
    (lambda d: _copy(d / "campaign-1-of-3.json", d / "campaign-1-of-3.json", lambda s: s["config"].update(max_kv_len=64)),
     "campaign-1-of-3.json", "config.max_kv_len is 64, but 12"),
    (lambda d: shutil.copy(d / "campaign-0-of-3.json", d / "campaign-5-of-3.json"),
     "campaign-5-of-3.json", "its name is no shard of the campaign: a shard is INDEX/COUNT with 0 <= INDEX < COUNT, got 5/3"),
    (lambda d: _copy(d / "campaign-1-of-3.json", d / "campaign-1-of-3.json", lambda s: s["config"].update(shard="1/99999999")),
     "campaign-1-of-3.json", "config.shard: a shard is INDEX/COUNT with COUNT at most 4096"),
    (lambda d: _copy(d / "campaign-1-of-3.json", d / "campaign-1-of-3.json",
                     lambda s: s["backends"]["sdpa-math"].update(passed=7)),
     "campaign-1-of-3.json", "backends.sdpa-math.passed: 7 passed and 0 unsupported of 2 examples"),
]


@pytest.mark.parametrize("edit, file, says", HOSTILE_MERGES, ids=[s for _, _, s in HOSTILE_MERGES])
def test_shard_states_that_are_not_one_campaign_s_are_exit_2_naming_file_and_field(three: Path, edit, file, says) -> None:  # type: ignore[no-untyped-def]
    edit(three / "shards")
    assert_clean(merge(three), BAD_INPUT, f"{three / 'shards' / file}: ", says)
    assert not (three / "summary.json").exists(), "nothing merged, nothing written"


def test_a_huge_shard_count_is_refused_on_the_command_line_and_in_a_file_name(tmp_path: Path) -> None:
    assert_clean(cli("fuzz", "-b", "sdpa-math", "--shard", "0/99999999", "--out", str(tmp_path)), BAD_INPUT,
                 f"--shard: a shard is INDEX/COUNT with COUNT at most {MAX_SHARDS}, got 0/99999999")
    assert not (tmp_path / "shards").exists()
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "campaign-0-of-99999999.json").write_text("{}")
    assert_clean(merge(tmp_path), BAD_INPUT, "campaign-0-of-99999999.json: its name is no shard of the campaign",
                 f"COUNT at most {MAX_SHARDS}")


@pytest.mark.parametrize("text", ["0/99999999", "٣/4", "1/2/3", "-1/2", "1.0/2", "0x1/2", "", "/"])
def test_a_shard_is_two_small_ascii_numbers(text: str) -> None:
    with pytest.raises(ValueError, match="a shard is INDEX/COUNT"):
        Shard.parse(text)
    assert Shard.parse(f"{MAX_SHARDS - 1}/{MAX_SHARDS}") == Shard(MAX_SHARDS - 1, MAX_SHARDS)
