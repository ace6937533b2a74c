from __future__ import annotations

import pytest
from click.testing import CliRunner

from backends.user import UserKernel
from fuzz.campaign import fuzz_backend
from fuzz.cli import main
from tests.quality import planted


@pytest.mark.parametrize("bug", planted.PLANTED)
def test_planted_bug_is_found_shrunk_and_reproduced(bug: str, tmp_path) -> None:
    spec = f"tests.quality.planted:{bug}"
    result = fuzz_backend(UserKernel.from_spec(spec), examples=200, out_dir=tmp_path, kernel_spec=spec)
    assert result.finding is not None, f"{bug} not found in 200 examples"
    case = result.finding.case
    assert case.layout.batch_size <= 2 and max(case.layout.kv_lens) <= 17, case.summary()
    assert "--kernel" in result.repro and (result.finding_dir / "report.md").exists()
    replayed = CliRunner().invoke(main, ["replay", str(result.finding_dir / "case.json")])
    assert replayed.exit_code == 1, replayed.output
    assert "FAIL" in replayed.output and "Worst elements" in replayed.output


def test_correct_but_differently_rounded_kernel_is_not_flagged(tmp_path) -> None:
    result = fuzz_backend(UserKernel(planted.correct_attention), examples=150, base_seed=11, out_dir=tmp_path)
    assert result.finding is None, result.finding.message if result.finding else ""
    assert result.passed == 150
