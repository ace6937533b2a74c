from __future__ import annotations

import pytest
from click.testing import CliRunner
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
from pa_oracle.fuzz.quality.selftest import run_selftest

from pa_oracle.cli import main


@pytest.mark.parametrize("bug", ["wrong_gqa_map", "top_left_causal", "last_page_off_by_one"])
def test_planted_bug_is_found_shrunk_and_reproduced(bug: str, tmp_path) -> None:
    spec = f"pa_oracle.fuzz.quality.planted:{bug}"
    result = fuzz_backend(UserKernel.from_spec(spec), CampaignConfig(examples=200, out_dir=tmp_path))
    assert result.finding is not None, f"{bug} not found in 200 examples"
    case = result.finding.case
    assert case.layout.batch_size <= 2 and max(case.layout.kv_lens) <= 17, case.summary()
    assert "--kernel" in result.repro and (result.finding_dir / "report.md").exists()
    replayed = CliRunner().invoke(main, ["replay", str(result.finding_dir / "case.json"), "--kernel", spec])
    assert replayed.exit_code == 1, replayed.output
    assert "FAIL" in replayed.output and "Worst" in replayed.output


def test_selftest_finds_every_planted_bug_and_flags_no_correct_kernel() -> None:
    results = run_selftest(examples=60, correct_examples=40, seed=0)
    missed = [r.kernel for r in results if r.planted and not r.detected]
    false_alarms = [f"{r.kernel}: {r.message}" for r in results if not r.planted and r.detected]
    assert not missed and not false_alarms, (missed, false_alarms)
