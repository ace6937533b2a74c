"""A write campaign whose time budget ends while an isolated case runs stopped at its budget ("running",
exit 0 when what ran passed), never "incomplete" (exit 3): the cut case was not judged and says nothing of
the kernel. Before the fix the budget's end mid-case read as a tool failure (benchmarks/h200/writes_fp8.sh)."""

from __future__ import annotations

from click.testing import CliRunner
from pa_oracle.backends.writes.user import user_write_kernel
from pa_oracle.cli import main
from pa_oracle.backends.writes import WriteBackend
from pa_oracle.fuzz.campaign.engine import CampaignConfig, Shared, fuzz_backend
from pa_oracle.fuzz.checks.append import WRITE

SPEC = "tests.slow_writes:slow_but_correct"


def test_the_budget_ending_mid_case_is_no_failure(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import time

    kernel = WriteBackend(user_write_kernel(SPEC), user=True)
    config = CampaignConfig(examples=500, isolate=True, case_timeout=60, out_dir=tmp_path, checks=(WRITE,), pipeline=False)
    result = fuzz_backend(kernel, config, check=WRITE, shared=Shared(deadline=time.monotonic() + 6.0))
    assert result.status == "running" and not result.findings, (result.status, result.notes)
    assert 0 < result.examples < 500


def test_the_cli_exits_0_when_the_budget_cuts_a_case(tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = ["writes", "--kernel", SPEC, "-n", "500", "--time-budget", "6", "--out", str(tmp_path / "w")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "INCOMPLETE" not in result.output, result.output
