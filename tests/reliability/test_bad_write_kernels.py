"""Hostile write kernels (``tests.reliability.bad_write_kernels``) through ``pa-oracle writes --kernel``:
isolated (the default for a user kernel) and in this process (``--no-isolate``), each ends in a finding
(exit 1) that names what it did, never in ``ok`` and never in a traceback. The ones marked "hole" passed
(exit 0) before the write judge kept the trust boundary of ``pa_oracle.fuzz.run.boundary``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from pa_oracle.cli import main
from pa_oracle.fuzz.run import boundary
from tests.reliability import bad_write_kernels

MODULE = "tests.reliability.bad_write_kernels"
ROOT = Path(__file__).resolve().parents[2]
MODES = ("--isolate", "--no-isolate")

# (kernel, the status its finding reports, what its message must say)
FINDINGS = [
    ("writes_a_canary_page", "fail", "a byte outside the appended slots changed"),
    ("writes_another_requests_slot", "fail", "an appended slot holds wrong bytes"),
    ("stores_padding_rows", "fail", "rows differ"),
    ("nan_into_fp8_canaries", "fail", "a byte outside the appended slots changed"),
    ("writes_then_restores_keeping_a_view", "fail", "an appended slot holds wrong bytes"),
    ("forgets_the_scale", "fail", "an appended slot holds wrong bytes"),  # the control of the two case changers
    *[(f"changes_{name}", "mutated", f"the kernel changed its inputs: {shown}") for name, shown in (
        ("key", "append_k"), ("value", "append_v"), ("slot_mapping", "slot_mapping"), ("kv_indices", "kv_indices"),
        ("kv_indptr", "kv_indptr"), ("kv_last_page_len", "kv_last_page_len"), ("positions", "positions"),
        ("batch_indices", "batch_indices"))],
    ("returns_a_written_copy", "crash", "returned a tuple; a write kernel writes its pools in place and returns None"),
    ("returns_true", "crash", "returned a bool; a write kernel writes its pools in place and returns None"),
    ("raises_system_exit", "crash", "SystemExit: 0"),
    ("raises_keyboard_interrupt", "crash", "KeyboardInterrupt"),
    ("raises_generator_exit", "crash", "GeneratorExit"),
    ("writes_nothing_rebinds_judge_write", "fail", "the kernel changed the judge: pa_oracle.fuzz.checks.append.judge_write"),
    ("writes_nothing_quantiser_swapped", "fail", "the kernel changed the judge: pa_oracle.oracle.append.quantised_values"),
    ("right_for_three_cases", "fail", "an appended slot holds wrong bytes"),
]
# the holes: each passed with exit 0 before (isolated and not)
HOLES = [
    ("swaps_the_pools_storage", "mutated", "k_pool (its tensor no longer views the memory it was handed"),
    ("frees_the_pools_memory", "mutated", "k_pool (its tensor no longer views the memory it was handed, or that memory shrank)"),
    ("makes_its_case_unpicklable", "fail", "the kernel changed the case it was given"),
    ("overwrites_the_judges_copy", "fail", "a byte outside the appended slots changed"),
    ("forgets_the_scale_and_rescales_the_case", "fail", "the kernel changed the case it was given"),
    ("RelabelsItsCase", "fail", "the kernel changed the case it was given"),
    ("ReturnsItsPools", "crash", "returned a tuple; a write kernel writes its pools in place and returns None"),
    ("writes_nothing_rebinds_compare_pools", "fail", "the kernel changed the judge: pa_oracle.oracle.append.compare_pools, "
     "pa_oracle.fuzz.checks.append.compare_pools"),
    ("writes_nothing_swaps_compare_pools_code", "fail", "the kernel changed the judge: pa_oracle.oracle.append.compare_pools.__code__"),
    ("writes_nothing_verdict_always_ok", "fail", "the kernel changed the judge: pa_oracle.oracle.append.AppendVerdict.ok"),
    ("writes_nothing_torch_ne_never", "fail", "the kernel changed the judge: torch.Tensor.__ne__"),
    ("forgets_the_scale_and_swaps_the_quantiser", "fail", "the kernel changed the judge: pa_oracle.oracle.append.quantised_values"),
    ("flips_tf32", "fail", "torch.backends.cuda.matmul.allow_tf32 False -> True"),
    ("sets_default_dtype", "fail", "numerics switches during its call: torch.get_default_dtype()"),
    ("flushes_denormals", "fail", "torch.set_flush_denormal (denormals flushed to zero) False -> True"),
]


# kernels that change whatever they find through gc: in this process they would also change other tests' objects
# (a lambda in every AppendCase of the pytest worker failed five triage tests under xdist), so they run in one of
# their own even with --no-isolate
REACH_EVERYTHING = {"makes_its_case_unpicklable", "overwrites_the_judges_copy", "forgets_the_scale_and_rescales_the_case"}


def writes(kernel: str, mode: str, *args: str, examples: int = 30, out: Path) -> tuple[int, str]:
    command = ["writes", "--kernel", f"{MODULE}:{kernel}", "-n", str(examples), mode, "--out", str(out), *args]
    if kernel in REACH_EVERYTHING:
        done = _cli(*command)
        return done.returncode, done.stdout + done.stderr
    result = CliRunner().invoke(main, command)
    return result.exit_code, result.output


def flushed() -> bool:
    """Whether this thread flushes denormals to zero (``torch.set_flush_denormal`` has no getter)."""
    return bool((torch.tensor([1e-310], dtype=torch.float64) * 1.0).item() == 0.0)


@pytest.fixture(autouse=True)
def judged_as_before():  # type: ignore[no-untyped-def]
    """torch's switches as before the test, whatever the kernel left (in this process: ``--no-isolate``)."""
    saved, flush = boundary.numerics(), flushed()
    bad_write_kernels.CALLS["n"] = 0
    yield
    boundary.restore_numerics(saved)
    torch.set_flush_denormal(flush)


@pytest.mark.parametrize("mode", MODES)
def test_a_correct_write_kernel_is_clean(tmp_path: Path, mode: str) -> None:
    code, output = writes("correct", mode, out=tmp_path)
    assert code == 0 and " ok   30 examples" in output, output


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("kernel", "status", "says"), FINDINGS + HOLES, ids=[k for k, *_ in FINDINGS + HOLES])
def test_a_hostile_write_kernel_is_a_finding(tmp_path: Path, kernel: str, status: str, says: str, mode: str) -> None:
    code, output = writes(kernel, mode, out=tmp_path)
    assert code == 1 and f"{MODULE}:{kernel} FAIL {status}" in output and says in output, output
    assert "Traceback" not in output and " ok " not in output, output


@pytest.mark.parametrize("mode", MODES)
def test_a_kernel_that_changed_the_judge_leaves_it_as_it_was(tmp_path: Path, mode: str) -> None:
    """After a kernel that rebound the judge and one that flushed denormals, a correct kernel is clean again
    in the same process, and a wrong one is still found."""
    for kernel in ("writes_nothing_rebinds_compare_pools", "flushes_denormals"):
        assert writes(kernel, "--no-isolate", out=tmp_path / kernel)[0] == 1
    assert not flushed()  # put back
    assert writes("correct", mode, out=tmp_path / "correct")[0] == 0
    code, output = writes("forgets_the_scale", mode, out=tmp_path / "wrong")
    assert code == 1 and "an appended slot holds wrong bytes" in output, output


def test_a_sleeping_kernel_is_a_hang_finding(tmp_path: Path) -> None:
    code, output = writes("sleeps", "--isolate", "--case-timeout", "1", examples=3, out=tmp_path)
    assert code == 1 and "FAIL hang" in output and "no answer after" in output, output


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pa_oracle", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("mode", MODES)
def test_an_os_exit_zero_is_a_crash_finding_never_exit_0(tmp_path: Path, mode: str) -> None:
    """The kernel's ``os._exit(0)`` is its crash: in one process (``--no-isolate``) it ended the run with
    status 0 and no verdict before (a hole); an isolated worker dies, and the parent says so."""
    done = _cli("writes", "--kernel", f"{MODULE}:exits_zero_hard", "-n", "5", mode, "--out", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    said = "the kernel called os._exit(0)" if mode == "--no-isolate" else "worker process died (exit code 0)"
    assert f"{MODULE}:exits_zero_hard FAIL crash" in done.stdout and said in done.stdout, done.stdout


def test_a_worker_ended_past_the_guard_with_status_0_is_a_crash_finding(tmp_path: Path) -> None:
    done = _cli("writes", "--kernel", f"{MODULE}:exits_zero_past_the_guard", "-n", "5", "--out", str(tmp_path))
    assert done.returncode == 1 and "worker process died (exit code 0)" in done.stdout, done.stdout + done.stderr


def test_the_switches_name_flushed_denormals_and_put_them_back() -> None:
    """``torch.set_flush_denormal`` has no getter: the boundary reads it from a denormal's product."""
    saved = boundary.numerics()
    torch.set_flush_denormal(True)
    try:
        if not flushed():
            pytest.skip("this CPU cannot flush denormals")
        assert any("set_flush_denormal" in text for text in boundary.numerics_changed(saved))
        assert boundary.restore_numerics(saved) and not flushed()
    finally:
        torch.set_flush_denormal(False)
