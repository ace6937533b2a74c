"""Issue 31: with isolation, the verdict is made in the parent, from the kernel's raw output and a reference
computed there, so what a kernel changes in the worker's process cannot make its own case pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from pa_oracle.backends.user import UserKernel
from pa_oracle.cli import main
from pa_oracle.fuzz.run.judge import case_judge
from pa_oracle.oracle.case import Case, Heads, Layout

MODULE = "tests.reliability.bad_kernels"
HOSTILE = f"{MODULE}:loosens_the_tolerance_it_is_judged_with"
CASE = Case(Layout.from_lengths([2, 3], [12, 12], 4), Heads(2, 1, 16, 16), seed=3)
# on a CUDA machine the worker still makes the verdict (isolation.verdict_in_parent: not measured on a GPU yet)
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the verdict is made in the parent only without CUDA")


def test_isolated_the_parent_fails_half_the_output() -> None:
    with case_judge(UserKernel.from_spec(HOSTILE), isolate=True, timeout=120) as judged:
        outcome = judged(CASE)
    assert outcome.status == "fail" and "out max error" in outcome.message, outcome.message
    assert outcome.output is not None  # a finding keeps the kernel's output


def test_isolated_a_correct_kernel_passes_with_its_statistics() -> None:
    with case_judge(UserKernel.from_spec(f"{MODULE}:correct"), isolate=True, timeout=120) as judged:
        outcome = judged(CASE)
    assert outcome.status == "pass" and outcome.verdict is not None and outcome.verdict.out.max_error > 0, outcome.message


def test_the_cli_finds_the_kernel_that_loosens_its_tolerance(tmp_path: Path) -> None:
    """(In one process the same kernel would pass: it loosens the judge's own ``Tolerance``; isolated, only
    the worker's copy.)"""
    args = ["fuzz", "--kernel", HOSTILE, "-n", "5", "--max-batch", "2", "--max-kv-len", "12", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert "out max error" in result.output, result.output
