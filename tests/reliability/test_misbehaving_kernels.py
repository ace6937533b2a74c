"""Hostile kernels (``tests.reliability.bad_kernels``) through the real CLI: each ends in a finding
with its case saved (exit 1), an incomplete run (exit 3) or a refusal of bad input (exit 2); never
in ``ok`` with exit 0 unless the kernel is correct. Crash isolation is the default for user kernels,
so most of these run in a worker process; a few run in-process (``--no-isolate``) too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pa_oracle.fuzz.campaign.engine
import pa_oracle.fuzz.run.runner
import pytest
import torch
from click.testing import CliRunner, Result
from pa_oracle.backends.base import Backend, Capabilities, KernelOutput
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend, run_campaign
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.fuzz.campaign.state import CampaignState, state_path
from pa_oracle.fuzz.draw.strategies import Limits
from pa_oracle.fuzz.quality.planted import correct_attention
from pa_oracle.oracle.case import Case, Heads, Layout
from pa_oracle.oracle.tensors import Tensors, load_case

from pa_oracle.cli import main
from pa_oracle.fuzz.campaign.finding_record import read_meta

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.reliability.bad_kernels"
SMALL = ["--max-batch", "2", "--max-kv-len", "12"]
TINY = Limits(max_batch=2, max_kv_len=12, max_qo_len=4, max_kv_heads=2, max_qo_heads=4, head_dims=(8, 16))

# (kernel, the message its finding must carry): each must end in exit 1 with its case saved
CONTRACT = [
    ("returns_numpy", "FAIL: kernel contract: out is a numpy.ndarray; expected a torch.Tensor"),
    ("returns_list", "FAIL: kernel contract: out is a builtins.int; expected a torch.Tensor"),
    ("returns_string_lse", "FAIL: kernel contract: lse is a builtins.str; expected a torch.Tensor or None"),
    ("returns_none", "FAIL: kernel contract: tests.reliability.bad_kernels:returns_none returned NoneType"),
    ("returns_three", "returned a tuple of 3; expected out or (out, lse)"),
    ("returns_wrong_shape", "FAIL: out has shape"),
    ("returns_wrong_dtype", "FAIL: kernel contract: out has dtype torch.int32"),
    ("returns_meta_tensor", "FAIL: kernel contract: out is on meta; the inputs are on c"),  # cpu or cuda
    ("returns_numpy_lse", "FAIL: kernel contract: lse is a numpy.ndarray"),
]
RAISES = [
    ("raises_value_error", "ValueError: kernel bug"),
    ("exits_zero", "SystemExit: 0 (the kernel called sys.exit)"),
    ("raises_keyboard_interrupt", "KeyboardInterrupt (raised by the kernel, not a Ctrl-C)"),
    ("raises_generator_exit", "GeneratorExit"),
    ("raises_base_exception", "_Odd: neither Exception nor an interrupt"),
]
INPUTS = ["q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"]
WRITES = [(f"writes_{name}", f"kernel modified its inputs: {name}") for name in INPUTS] + [
    ("zeroes_kv_indices", "kernel modified its inputs: kv_indices"),
    ("writes_alibi_slopes", "kernel modified its inputs: alibi_slopes"),
]
DEATHS = [  # os.kill(SIGSEGV): test_the_real_cli_survives_a_segfault_and_says_so
    ("dereferences_null", "worker process died (signal SIGSEGV)"),
    ("exits_hard", "worker process died (exit code 3)"),
    ("hangs", "hang: no answer after 3 s (worker restarted)"),  # --case-timeout 1, 3x for a first case
]


def fuzz_cli(tmp_path: Path, kernel: str, *args: str, examples: int = 10) -> Result:
    return CliRunner().invoke(
        main, ["fuzz", "--kernel", f"{MODULE}:{kernel}", "-n", str(examples), *SMALL, "--out", str(tmp_path), *args]
    )


def saved_finding(out: Path, kernel: str) -> dict[str, Any]:
    """The one finding of the run's summary, after checking that its folder holds a loadable case."""
    summary = json.loads((out / "summary.json").read_text())
    [entry] = summary
    assert entry["status"] == "finding" and len(entry["findings"]) == 1, entry
    finding = entry["findings"][0]
    folder = Path(finding["dir"])
    assert {"case.json", "tensors.npz", "report.md"} <= {p.name for p in folder.iterdir()}, folder
    case = load_case(folder / "case.json")
    meta = read_meta(case.meta, folder)
    assert folder.name == finding["case_id"] and meta.kernel == f"{MODULE}:{kernel}"
    assert meta.found_by is not None and meta.found_by.status == finding["status"]
    return finding


@pytest.mark.parametrize(("kernel", "message"), CONTRACT + RAISES + WRITES, ids=[k for k, _ in CONTRACT + RAISES + WRITES])
def test_a_misbehaving_kernel_is_a_finding_with_its_case_saved(tmp_path: Path, kernel: str, message: str) -> None:
    """In this process (``--no-isolate``: the same judge as in a worker, without a worker's start)."""
    result = fuzz_cli(tmp_path, kernel, "--no-isolate")
    assert result.exit_code == 1, result.output
    assert f"FINDING in {MODULE}:{kernel}" in result.output and message in result.output, result.output
    assert message in saved_finding(tmp_path, kernel)["message"]


ISOLATED = [CONTRACT[0], CONTRACT[7], RAISES[1], RAISES[2], WRITES[5]]


@pytest.mark.parametrize(("kernel", "message"), ISOLATED, ids=[k for k, _ in ISOLATED])
def test_isolated_by_default_a_misbehaving_kernel_is_a_finding_too(tmp_path: Path, kernel: str, message: str) -> None:
    result = fuzz_cli(tmp_path, kernel)
    assert result.exit_code == 1 and message in result.output, result.output
    assert message in saved_finding(tmp_path, kernel)["message"]


@pytest.mark.parametrize(("kernel", "message"), DEATHS, ids=[k for k, _ in DEATHS])
def test_a_kernel_that_kills_or_stalls_its_process_is_a_crash_finding(tmp_path: Path, kernel: str, message: str) -> None:
    result = fuzz_cli(tmp_path, kernel, "--case-timeout", "1", examples=5)
    assert result.exit_code == 1, result.output
    assert message in result.output, result.output
    finding = saved_finding(tmp_path, kernel)
    assert finding["status"] == "crash" and message in finding["message"]


def test_the_real_cli_survives_a_segfault_and_says_so(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pa_oracle", "fuzz", "--kernel", f"{MODULE}:segfaults", "-n", "3", *SMALL, "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    )
    assert run.returncode == 1, run.stderr
    assert "FINDING in tests.reliability.bad_kernels:segfaults: worker process died (signal SIGSEGV)" in run.stdout
    assert "Traceback" not in run.stdout + run.stderr
    saved_finding(tmp_path, "segfaults")


def test_a_correct_kernel_passes_isolated(tmp_path: Path) -> None:
    result = fuzz_cli(tmp_path, "correct")
    assert result.exit_code == 0, result.output
    assert f"{MODULE}:correct: ok, 10 examples (10 passed" in result.output


def test_the_time_budget_bounds_a_hanging_case_which_is_out_of_time_not_a_finding(tmp_path: Path) -> None:
    start = time.monotonic()
    result = fuzz_cli(tmp_path, "hangs", "--time-budget", "3", "--case-timeout", "100")
    assert time.monotonic() - start < 30, "the budget did not bound the hanging case"
    assert result.exit_code == 3, result.output
    assert "INCOMPLETE (no example ran)" in result.output and "FINDING" not in result.output
    [entry] = json.loads((tmp_path / "summary.json").read_text())
    assert entry["status"] == "incomplete" and entry["findings"] == []
    assert any(note.startswith("the time budget ran out") for note in entry["notes"]), entry["notes"]


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf"])
def test_a_case_timeout_that_would_make_every_case_a_hang_is_refused(tmp_path: Path, timeout: str) -> None:
    result = fuzz_cli(tmp_path, "correct", "--case-timeout", timeout)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--case-timeout'" in result.output and "finite" in result.output, result.output
    assert not (tmp_path / "summary.json").exists()


def test_a_kernel_that_supports_nothing_is_incomplete_not_ok(tmp_path: Path) -> None:
    result = fuzz_cli(tmp_path, "always_refuses", examples=5)
    assert result.exit_code == 3, result.output
    assert "INCOMPLETE (all 5 examples were unsupported)" in result.output and ": ok," not in result.output


@pytest.fixture(scope="module")
def crash_finding(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of an ``os._exit(3)`` finding (replay and triage read it)."""
    out = tmp_path_factory.mktemp("crash")
    assert fuzz_cli(out, "exits_hard", examples=3).exit_code == 1
    return Path(saved_finding(out, "exits_hard")["dir"])


@pytest.fixture(scope="module")
def hang_finding(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hang")
    assert fuzz_cli(out, "hangs", "--case-timeout", "1", examples=3).exit_code == 1
    return Path(saved_finding(out, "hangs")["dir"])


def test_a_replayed_crash_finding_replays_as_a_crash(crash_finding: Path) -> None:
    result = CliRunner().invoke(main, ["replay", str(crash_finding / "case.json"), "--kernel", f"{MODULE}:exits_hard"])
    assert result.exit_code == 1, result.output
    assert f"{MODULE}:exits_hard: CRASH: worker process died (exit code 3)" in result.output


def test_a_replayed_hang_finding_replays_as_a_hang(hang_finding: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PA_ORACLE_CASE_TIMEOUT", "1")
    result = CliRunner().invoke(main, ["replay", str(hang_finding / "case.json"), "--kernel", f"{MODULE}:hangs", "--json"])
    assert result.exit_code == 1, result.output
    assert json.loads(result.output)["status"] == "crash" and "hang: no answer after 3 s" in result.output
    monkeypatch.setenv("PA_ORACLE_CASE_TIMEOUT", "0")
    refused = CliRunner().invoke(main, ["replay", str(hang_finding / "case.json"), "--kernel", f"{MODULE}:hangs"])
    assert refused.exit_code == 2 and "PA_ORACLE_CASE_TIMEOUT='0'" in refused.output, refused.output


def test_triage_minimizes_over_a_crashing_kernel(crash_finding: Path, tmp_path: Path) -> None:
    """Every candidate kills the worker the same way: it reproduces the crash, the triage lives on."""
    args = ["triage", str(crash_finding), "--kernel", f"{MODULE}:exits_hard", "--budget", "3", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert f"{MODULE}:exits_hard" in result.output and "CRASHES" in result.output
    assert "worker process died (exit code 3)" in result.output and (tmp_path / "triage.md").exists()


def test_triage_of_a_hang_reports_the_hang_without_minimizing(hang_finding: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PA_ORACLE_CASE_TIMEOUT", "1")
    result = CliRunner().invoke(main, ["triage", str(hang_finding), "--kernel", f"{MODULE}:hangs", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "CRASHES" in result.output and "hang: no answer after 3 s" in result.output
    assert "not minimizing a hang" in result.output


def _terminal_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_real_ctrl_c_stops_the_campaign_keeps_its_state_and_is_no_finding(tmp_path: Path) -> None:
    """SIGINT to the process group, as a terminal sends it: the worker ignores it, the parent stops."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pa_oracle", "fuzz", "--kernel", f"{MODULE}:slow_correct", "-n", "1000", *SMALL, "--out", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
        preexec_fn=_terminal_sigint,  # a shell starts the CLI with SIGINT at its default, whatever this test process inherited
    )
    try:
        state = tmp_path / "campaign.json"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if state.exists() and json.loads(state.read_text())["backends"][f"{MODULE}:slow_correct"]["chunks_done"] >= 1:
                break
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    result = json.loads(state.read_text())["backends"][f"{MODULE}:slow_correct"]
    assert proc.returncode == 130, output  # interrupted: neither ok nor a finding
    assert "interrupted" in output and "--resume continues it" in output, output
    assert result["findings"] == [] and result["chunks_done"] >= 1 and result["examples"] == 25 * result["chunks_done"], (result, output)
    assert "FINDING" not in output and "crash" not in output.lower(), output
    assert not [p for p in tmp_path.iterdir() if p.is_dir()], "no finding folder was written"


# --- the library paths -----------------------------------------------------------------------------


def test_a_block_table_a_dict_plan_holds_is_checksummed() -> None:
    """The default ``plan_inputs``: every tensor of a dict plan (block tables, indices) is an input."""

    class ZeroesItsBlockTable(Backend):
        name = "zeroes-block-table"
        capabilities = Capabilities(devices=("cpu",), alibi=False, sinks=False, fp8_scales=False)

        def plan(self, case: Case) -> dict[str, Any]:
            lay = case.layout
            return {"case": case, "block_table": torch.tensor(lay.block_table(pad=0), dtype=torch.int32),
                    "kv_indices": torch.tensor(lay.kv_indices, dtype=torch.int32)}

        def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
            case = plan["case"]
            lay, opts = case.layout, case.options
            out, lse = correct_attention(
                tensors.q, tensors.k_cache, tensors.v_cache, qo_indptr=torch.tensor(lay.qo_indptr),
                kv_indptr=torch.tensor(lay.kv_indptr), kv_indices=plan["kv_indices"],
                kv_last_page_len=torch.tensor(lay.kv_last_page_len), causal=opts.causal, sm_scale=case.sm_scale,
                window_left=opts.window_left, logits_soft_cap=opts.logits_soft_cap,
            )
            plan["block_table"].zero_()
            return KernelOutput(out, lse)

    case = Case(Layout.from_lengths([1], [9], 4, page_order=[3, 0, 4, 1, 2], extra_pages=2), Heads(2, 1, 8, 8))
    outcome = pa_oracle.fuzz.run.runner.check_case(ZeroesItsBlockTable(), case)
    assert outcome.status == "fail" and outcome.message == "FAIL: kernel modified its inputs: plan['block_table']"


def test_an_output_the_oracle_cannot_judge_stops_the_backend_as_incomplete(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}
    real = pa_oracle.fuzz.run.runner.judge

    def breaks_on_the_third(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("an oracle bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(pa_oracle.fuzz.run.runner, "judge", breaks_on_the_third)
    result = fuzz_backend(UserKernel.from_spec(f"{MODULE}:correct"), CampaignConfig(examples=10, limits=TINY, isolate=False))
    assert result.status == "incomplete" and not result.is_complete and result.examples == 2 and not result.findings
    assert "the oracle could not judge the output: RuntimeError: an oracle bug" in result.notes[-1]
    assert "INCOMPLETE (the oracle could not judge case" in result.line()


def test_an_internal_error_stops_the_backend_as_incomplete_and_the_campaign_goes_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = pa_oracle.fuzz.run.runner.check_case

    def fails_for_one(backend: Backend, case: Case, tolerance: Any, *rest: Any) -> Any:
        if backend.name.endswith("slightly_off"):
            raise RuntimeError("boom")
        return real(backend, case, tolerance, *rest)

    monkeypatch.setattr(pa_oracle.fuzz.run.runner, "check_case", fails_for_one)
    backends = [UserKernel.from_spec(f"{MODULE}:slightly_off"), UserKernel.from_spec(f"{MODULE}:correct")]
    path = state_path(tmp_path, Shard())
    broken, fine = run_campaign(backends, CampaignState({"seed": 0}), path, CampaignConfig(examples=5, limits=TINY, isolate=False))
    assert broken.status == "incomplete" and broken.notes[-1] == "internal error: RuntimeError: boom"
    assert fine.status == "done" and fine.is_complete and fine.passed == 5


def test_a_campaign_whose_budget_ends_before_any_example_is_incomplete(tmp_path: Path) -> None:
    path = state_path(tmp_path, Shard())
    [result] = run_campaign([UserKernel.from_spec(f"{MODULE}:correct")], CampaignState({"seed": 0}), path, CampaignConfig(examples=5, limits=TINY, time_budget=1e-9, isolate=False))
    assert result.status == "incomplete" and result.notes == ["no example ran"] and not result.is_complete


def test_the_run_campaign_refuses_a_zero_case_timeout(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="finite number of seconds > 0"):
        run_campaign([UserKernel.from_spec(f"{MODULE}:correct")], CampaignState({}), tmp_path / "c.json", CampaignConfig(examples=1, case_timeout=0))
