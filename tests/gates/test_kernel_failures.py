"""A kernel that raises, or returns an output of the wrong shape, inside a gate's model run makes the gate fail
(exit 1, the backend and what it did named), never "bad input" (exit 2): the user's command was right, the kernel
broke its contract (as `pa-oracle fuzz` counts both as findings)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pa_oracle.cli import main

MODULE = "tests.gates.broken_gate_kernels"


@pytest.mark.parametrize(("kernel", "said"), [("raises_in_the_model", "ValueError: an index out of range in my kernel"),
                                              ("returns_one_row", "returned out")])
def test_a_kernel_that_breaks_fails_the_logit_gate(kernel: str, said: str, tiny_dir, gsm8k_dir) -> None:  # type: ignore[no-untyped-def]
    args = ["gate", "logits", "--model", str(tiny_dir), "--data", str(gsm8k_dir), "--limit", "1", "--batch-size", "1",
            "--backend", f"{MODULE}:{kernel}"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert said in result.output and f"{MODULE}:{kernel}" in result.output, result.output
    assert "Traceback" not in result.output


def test_a_reference_that_breaks_is_no_verdict_on_the_backend(tiny_dir, gsm8k_dir) -> None:  # type: ignore[no-untyped-def]
    args = ["gate", "logits", "--model", str(tiny_dir), "--data", str(gsm8k_dir), "--limit", "1", "--batch-size", "1",
            "--backend", "sdpa-math", "--reference", f"{MODULE}:raises_in_the_model"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 3, result.output
    assert "no verdict on sdpa-math" in result.output, result.output
