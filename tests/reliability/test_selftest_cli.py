"""``pa-oracle selftest`` (issue 35): a line per kernel with its time, the time so far and an estimate of
the time left; ``--time-budget`` stops it and names what did not run (exit 3, no verdict on those);
a missed bug is exit 1; shrinking is bounded (Hypothesis' five-minute shrink warning never comes)."""

from __future__ import annotations

import json
import re
import types

import pytest
from click.testing import CliRunner, Result

import pa_oracle.cli
from pa_oracle.fuzz.quality import planted, selftest

LINE = re.compile(r"^\[(\d+)/(\d+)\] (ok |BAD|---) (\w+): .* after \d+ examples in (?:\d+m)?\d+s \(elapsed (?:\d+m)?\d+s, about (?:\d+m)?\d+s left\)", re.M)


def run(*args: str) -> Result:
    return CliRunner().invoke(pa_oracle.cli.main, ["selftest", *args])


def fake_module(bugs: tuple[str, ...], correct: tuple[str, ...]) -> types.SimpleNamespace:
    return types.SimpleNamespace(__name__=planted.__name__, BUGS=bugs, PLANTED=bugs, CORRECT=correct,
                                 **{n: getattr(planted, n) for n in bugs + correct})


def test_progress_lines_and_a_clean_run_exit_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selftest, "MODULES", (fake_module(("wrong_gqa_map", "top_left_causal"), ("correct_attention",)),))
    result = run("-n", "40", "--correct-examples", "5")
    assert result.exit_code == 0, result.output
    assert "selftest: 3 kernels (2 planted bugs, 1 correct)" in result.output
    lines = LINE.findall(result.output)
    assert [(n, total, verdict, name) for n, total, verdict, name in lines] == [
        ("1", "3", "ok ", "wrong_gqa_map"), ("2", "3", "ok ", "top_left_causal"), ("3", "3", "ok ", "correct_attention")], result.output
    assert "detection 2/2 planted bugs" in result.output and "false alarms 0/1" in result.output


def test_a_missed_bug_is_exit_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 'bug' that is a correct kernel is never found: selftest fails."""
    module = fake_module((), ())
    module.BUGS = module.PLANTED = ("correct_attention",)
    module.correct_attention = planted.correct_attention
    monkeypatch.setattr(selftest, "MODULES", (module,))
    result = run("-n", "5")
    assert result.exit_code == 1, result.output
    assert "BAD correct_attention: not flagged after 5 examples" in result.output and "detection 0/1" in result.output


def test_time_budget_stops_and_names_what_did_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selftest, "MODULES", (fake_module(("wrong_gqa_map", "top_left_causal"), ("correct_attention", "correct_float64")),))
    result = run("-n", "40", "--correct-examples", "100000", "--time-budget", "3")
    assert result.exit_code == 3, result.output
    assert re.search(r"--time-budget 3s ran out: \d of 4 kernels did not run \(or were cut\): .*correct_float64; no verdict on them", result.output)
    assert "Traceback" not in result.output


def test_time_budget_json_lists_every_kernel_with_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selftest, "MODULES", (fake_module(("wrong_gqa_map",), ("correct_attention",)),))
    result = run("-n", "40", "--correct-examples", "100000", "--time-budget", "2", "--json")
    assert result.exit_code == 3, result.output
    rows = json.loads(result.stdout)
    assert [r["kernel"] for r in rows] == ["wrong_gqa_map", "correct_attention"]
    assert rows[0]["ran"] and rows[0]["detected"] and not rows[1]["ran"]


@pytest.mark.parametrize("budget", ["0", "-1", "nan", "inf", "soon"])
def test_nonsense_time_budgets_are_usage_errors(budget: str) -> None:
    result = run("--time-budget", budget)
    assert result.exit_code == 2, result.output
    assert "--time-budget" in result.output and "Traceback" not in result.output


def test_shrinking_is_bounded_and_the_finding_kept() -> None:
    from pa_oracle.backends.user import UserKernel
    from pa_oracle.fuzz.campaign.engine import CampaignConfig, Hooks, fuzz_backend

    def shrink_steps(seconds: float | None) -> tuple[int, object]:
        steps = [0]

        def on_case(result: object, searching: bool) -> None:
            steps[0] += not searching

        kernel = UserKernel(planted.window_off_by_one, name=f"{planted.__name__}:window_off_by_one")
        config = CampaignConfig(examples=100, isolate=False, shrink_seconds=seconds)
        outcome = fuzz_backend(kernel, config, hooks=Hooks(on_case=on_case))
        return steps[0], outcome.finding

    bounded, finding = shrink_steps(1e-9)
    assert finding is not None, "the finding is kept when shrinking stops"
    assert bounded <= 2, bounded
    unbounded, _ = shrink_steps(None)
    assert unbounded > bounded, "without the bound it shrinks further (else this test shows nothing)"
