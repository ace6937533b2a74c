"""Exit codes mean one thing for every command (``pa_oracle.fuzz.exits``): 0 no finding, 1 a finding, 2 bad
input or usage, 3 the tool itself failed; bad input never shows a traceback, an internal error
shows one line and the file that holds the trace."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from pa_oracle.fuzz.campaign.state import BackendResult, CampaignState, FindingRecord
from pa_oracle.fuzz.exits import BAD_INPUT, FINDING, INTERRUPTED, NO_FINDING, TOOL_FAILED, campaign_exit_code
from pa_oracle.fuzz.run.runner import OracleDisagreement
from pa_oracle.oracle.case import Case, Heads, Layout, Options

import pa_oracle.cli
import pa_oracle.fuzz.campaign.engine

TINY = ["--max-batch", "2", "--max-kv-len", "12"]
GQA_BUG = "pa_oracle.fuzz.quality.planted:wrong_gqa_map"
CORRECT = "pa_oracle.fuzz.quality.planted:correct_attention"
TRACEBACK = "Traceback (most recent call last)"


def cli(*args: str) -> Result:
    return CliRunner().invoke(pa_oracle.cli.main, list(args))


def exits_zero(q, k_cache, v_cache, **kwargs):  # type: ignore[no-untyped-def]
    """A broken kernel that ends the process with status 0 instead of returning."""
    sys.exit(0)


def small_case() -> Case:
    return Case(Layout((0, 2), (0, 1), (0,), (3,), 4, 1), Heads(2, 1, 16, 16), Options(causal=True), seed=1)


def assert_clean(result: Result, code: int, *messages: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output)
    for message in messages:
        assert message in result.output, result.output
    assert TRACEBACK not in result.output


# --- 0 and 1 -------------------------------------------------------------------------------------


def test_fuzz_exits_0_without_a_finding_and_1_with_one(tmp_path) -> None:
    assert_clean(cli("fuzz", "-b", "sdpa-math", "-n", "5", *TINY, "--out", str(tmp_path / "ok")), NO_FINDING, "sdpa-math: ok")
    assert_clean(cli("fuzz", "-k", GQA_BUG, "-n", "30", *TINY, "--out", str(tmp_path / "bug")), FINDING, "FINDING in")


def test_replay_exits_0_on_a_pass_and_1_on_a_failure(tmp_path) -> None:
    path = small_case().save(tmp_path / "case.json")
    assert_clean(cli("replay", str(path), "-b", "sdpa-math"), NO_FINDING)
    assert_clean(cli("replay", str(path), "-k", "pa_oracle.fuzz.quality.planted:last_page_off_by_one"), FINDING)


def test_env_and_help_exit_0_and_the_help_documents_the_codes() -> None:
    assert_clean(cli("env", "--json"), NO_FINDING)
    result = cli("--help")
    assert_clean(result, NO_FINDING, "Exit status", "0    no finding", "1    a finding", "2    bad input", "3    the tool itself failed")


# --- 2: bad input or usage -----------------------------------------------------------------------

BAD_FUZZ_OPTIONS = [
    (["-n", "-5"], "-5 is not in the range x>=1"),
    (["-n", "0"], "0 is not in the range x>=1"),
    (["--time-budget", "0"], "not in the range x>0"),
    (["--time-budget", "-3"], "not in the range x>0"),
    (["--time-budget", "nan"], "'nan' is not a finite number"),
    (["--time-budget", "inf"], "'inf' is not a finite number"),
    (["--case-timeout", "0"], "not in the range x>0"),
    (["--case-timeout", "nan"], "'nan' is not a finite number"),
    (["--max-batch", "0"], "not in the range 1<=x<=4096"),
    (["--max-batch", "99999"], "not in the range 1<=x<=4096"),
    (["--max-kv-len", "0"], "not in the range 1<=x<=1048576"),
    (["--max-kv-len", str(2**70)], "not in the range 1<=x<=1048576"),
    (["--workers", "0"], "not in the range 1<=x<=4096"),
    (["--shard", "2/2"], "0 <= INDEX < COUNT"),
    (["--only", "max_group_size=abc"], "takes a non-negative integer"),
    (["--only", "nonsense=1"], "FIELD=VALUES"),
    (["--resume", "--overwrite"], "give one of them"),
    (["-b", "no-such-backend"], "no-such-backend"),
    (["-k", "no_colon_here"], "MODULE:FUNCTION"),
]


@pytest.mark.parametrize("args, message", BAD_FUZZ_OPTIONS, ids=[" ".join(a) for a, _ in BAD_FUZZ_OPTIONS])
def test_fuzz_refuses_bad_options_with_exit_2(tmp_path, args: list[str], message: str) -> None:
    assert_clean(cli("fuzz", "-b", "sdpa-math", *TINY, "--out", str(tmp_path), *args), BAD_INPUT, message)
    assert not (tmp_path / "campaign.json").exists(), "a refused run started a campaign"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a CPU-only machine")
def test_only_devices_cuda_is_refused_on_a_cpu_machine(tmp_path) -> None:
    result = cli("fuzz", "-k", CORRECT, "--only", "devices=cuda", "-n", "2", *TINY, "--out", str(tmp_path))
    assert_clean(result, BAD_INPUT, "--only devices=cuda", "cpu only")


BAD_STATES = {
    "not json": "{",
    "a list": "[]",
    "unknown schema": json.dumps({"schema_version": 99, "config": {}, "backends": {}}),
    "bad backend entry": json.dumps({"schema_version": 1, "config": {}, "backends": {"x": {"bogus": 1}}}),
}


@pytest.mark.parametrize("name", BAD_STATES)
def test_a_malformed_campaign_state_on_resume_exits_2(tmp_path, name: str) -> None:
    (tmp_path / "campaign.json").write_text(BAD_STATES[name])
    assert_clean(cli("fuzz", "--out", str(tmp_path), "--resume"), BAD_INPUT, str(tmp_path / "campaign.json"))


def test_a_malformed_ledger_exits_2(tmp_path) -> None:
    ledger = tmp_path / "ledger.json"
    ledger.write_text(json.dumps({"schema_version": 1, "entries": [{"case": "c"}]}))
    assert_clean(cli("fuzz", "-b", "sdpa-math", "-n", "2", "--ledger", str(ledger), "--out", str(tmp_path / "o")),
                 BAD_INPUT, "ledger.json")


MALFORMED_CASES = {
    "schema": {"schema_version": 7},
    "not json": "{not json",
    "a list": [],
    "missing field": {"schema_version": small_case().to_json()["schema_version"]},
}


@pytest.mark.parametrize("name", MALFORMED_CASES)
def test_replay_metamorphic_and_triage_refuse_a_malformed_case_with_exit_2(tmp_path, name: str) -> None:
    path = tmp_path / "case.json"
    body = MALFORMED_CASES[name]
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    assert_clean(cli("replay", str(path), "-b", "sdpa-math"), BAD_INPUT, "case")
    assert_clean(cli("metamorphic", "--case", str(path), "-b", "sdpa-math", "--out", str(tmp_path / "m")), BAD_INPUT, "case")
    assert_clean(cli("triage", str(path), "-b", "sdpa-math", "--out", str(tmp_path / "t")), BAD_INPUT, "case")


def test_the_other_commands_refuse_bad_counts_with_exit_2(tmp_path) -> None:
    assert_clean(cli("replay", str(tmp_path / "missing.json"), "-b", "sdpa-math"), BAD_INPUT, "does not exist")
    assert_clean(cli("metamorphic", "-b", "sdpa-math", "-n", "0", "--out", str(tmp_path)), BAD_INPUT, "x>=1")
    assert_clean(cli("metamorphic", "-b", "sdpa-math", "-c", "relabl", "--out", str(tmp_path)), BAD_INPUT, "did you mean relabel")
    assert_clean(cli("properties", "-b", "sdpa-math", "-n", "-1"), BAD_INPUT, "x>=1")
    assert_clean(cli("selftest", "-n", "0"), BAD_INPUT, "x>=1")
    assert_clean(cli("selftest", "--correct-examples", "0"), BAD_INPUT, "x>=1")
    assert_clean(cli("triage", str(tmp_path), "-b", "sdpa-math"), BAD_INPUT, "no case.json")
    case = small_case().save(tmp_path / "c" / "case.json")
    assert_clean(cli("golden", "add", str(case), "--golden-dir", str(tmp_path / "g")), BAD_INPUT)
    assert_clean(cli("gate", "gsm8k", "--model", "m", "-b", "x", "-r", "oracle", "--alpha", "2"), BAD_INPUT, "--alpha")


def test_worker_exit_2_propagates_to_the_parent(tmp_path) -> None:
    result = cli("fuzz", "-b", "sdpa-math", "--workers", "2", "--resume", "-n", "2", "--out", str(tmp_path))
    assert_clean(result, BAD_INPUT, "shard 0/2 exited with 2 (bad input)")  # the workers said why on stderr


def test_bad_input_is_refused_before_anything_is_written_under_out(tmp_path) -> None:
    for workers in ("1", "2"):
        result = cli("fuzz", "-b", "no-such-backend", "--workers", workers, "--out", str(tmp_path / "out"))
        assert_clean(result, BAD_INPUT, "no-such-backend")
        assert not (tmp_path / "out").exists()


# --- 3: the tool failed --------------------------------------------------------------------------


def test_an_unwritable_out_exits_3_naming_the_path(tmp_path) -> None:
    (tmp_path / "file").write_text("a regular file: nothing can be created under it, not even by root")
    result = cli("fuzz", "-b", "sdpa-math", "-n", "2", "--out", str(tmp_path / "file" / "sub"))
    assert_clean(result, TOOL_FAILED, "I/O error", str(tmp_path / "file"))


def test_an_internal_error_is_one_line_and_the_trace_goes_to_a_file_under_out(tmp_path, monkeypatch) -> None:
    def boom(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise ZeroDivisionError("boom in the campaign")

    monkeypatch.setattr(pa_oracle.fuzz.campaign.engine, "run_campaign", boom)
    result = cli("fuzz", "-b", "sdpa-math", "-n", "2", "--out", str(tmp_path))
    assert_clean(result, TOOL_FAILED, "internal error: ZeroDivisionError: boom in the campaign (full trace: ")
    error_lines = [line for line in result.output.splitlines() if "boom" in line]
    assert len(error_lines) == 1
    trace = Path(error_lines[0].rsplit("(full trace: ", 1)[1].rstrip(")"))
    assert trace.parent == tmp_path and TRACEBACK in trace.read_text() and "boom in the campaign" in trace.read_text()


def test_an_oracle_disagreement_exits_3_not_1(tmp_path, monkeypatch) -> None:
    def disagree(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OracleDisagreement("the fused oracle failed the kernel but the torch reference passes it")

    monkeypatch.setattr(pa_oracle.fuzz.campaign.engine, "run_campaign", disagree)
    result = cli("fuzz", "-b", "sdpa-math", "-n", "2", "--out", str(tmp_path))
    assert_clean(result, TOOL_FAILED, "oracle disagreement (a bug in pa-oracle, not a finding)")


def test_a_backend_that_ran_no_example_exits_3(tmp_path) -> None:
    ledger = tmp_path / "ledger.json"  # covers every case --max-batch 2 can draw: every one is skipped as known
    entry = {"case": "c", "backends": [CORRECT], "status": "tolerated", "reason": "r", "issue": "https://x/1",
             "matches": {"batch_size": [1, 2]}}
    ledger.write_text(json.dumps({"schema_version": 1, "entries": [entry]}))
    result = cli("fuzz", "-k", CORRECT, "-n", "5", *TINY, "--ledger", str(ledger), "--out", str(tmp_path / "o"))
    assert_clean(result, TOOL_FAILED, f"{CORRECT} stopped early (exhausted) after 0 examples")


def test_a_kernel_calling_sys_exit_0_never_passes(tmp_path) -> None:
    result = cli("fuzz", "-k", "tests.reliability.test_exit_codes:exits_zero", "-n", "3", *TINY, "--out", str(tmp_path))
    assert result.exit_code in (FINDING, TOOL_FAILED), result.output
    assert TRACEBACK not in result.output


def test_an_interrupt_exits_130_not_1(tmp_path, monkeypatch) -> None:
    def interrupted(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(pa_oracle.fuzz.campaign.engine, "run_campaign", interrupted)
    assert_clean(cli("fuzz", "-b", "sdpa-math", "-n", "2", "--out", str(tmp_path)), INTERRUPTED, "--resume continues it")


# --- the mapping from results ----------------------------------------------------------------


def result(status: str, examples: int = 10, finding: bool = False) -> BackendResult:
    found = [FindingRecord("id", "fail", "m", "case", None, None)] if finding else []
    return BackendResult("b", examples=examples, status=status, findings=found)  # type: ignore[arg-type]


@pytest.mark.parametrize("results, kwargs, code", [
    ([result("done")], {}, NO_FINDING),
    ([result("running")], {}, NO_FINDING),  # stopped by the time budget
    ([result("finding", finding=True)], {}, FINDING),
    ([result("exhausted")], {}, TOOL_FAILED),
    ([result("stopped")], {}, TOOL_FAILED),  # any status this version does not know
    ([result("done", examples=0)], {}, TOOL_FAILED),
    ([result("pending", examples=0)], {"may_be_empty": True}, NO_FINDING),  # the budget ran out before its turn
    ([result("finding", finding=True), result("exhausted")], {}, TOOL_FAILED),
    ([], {}, TOOL_FAILED),
    ([result("done")], {"worker_codes": [0, 1]}, NO_FINDING),
    ([result("done")], {"worker_codes": [0, 3]}, TOOL_FAILED),
    ([result("done")], {"worker_codes": [-9, 0]}, TOOL_FAILED),  # a worker killed by a signal
    ([], {"worker_codes": [2, 2]}, BAD_INPUT),
])
def test_campaign_exit_code(results, kwargs, code) -> None:  # type: ignore[no-untyped-def]
    got, why = campaign_exit_code(results, **kwargs)
    assert got == code and bool(why) == (code in (BAD_INPUT, TOOL_FAILED)), why


def test_a_resume_keeps_its_bad_state_message_naming_the_option(tmp_path) -> None:
    CampaignState({"seed": 3, "max_batch": 2, "max_kv_len": 12, "only": [], "backends": ["sdpa-math"], "kernels": [],
                   "shard": "0/1"}).save(tmp_path / "campaign.json")
    assert_clean(cli("fuzz", "--out", str(tmp_path), "--resume", "--seed", "4"), BAD_INPUT, "started with seed=3, not 4")
