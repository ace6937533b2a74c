"""Issue 43: one triage report states one set of numbers. For a finding of a user kernel that applies the soft cap
after ALiBi, triage's terminal line, triage.md, ISSUE.md and repro.py state the minimized case's errors and limits
as the judge computed them (repro.py checks the judge's limits), the finding's report.md and triage.md the same for
the case as given; ISSUE.md's title names the failing quantities and their ratios, it shows expected and actual
values, and its call runs as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from click.testing import CliRunner, Result
from pa_oracle.backends.user import UserKernel
from pa_oracle.cli import main
from pa_oracle.fuzz.campaign.findings import ratio_words, save_finding
from pa_oracle.fuzz.campaign.strength import limits, strengths
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.tensors import load_case

from .conftest import CAP_ALIBI, cap_alibi_case

ROOT = Path(__file__).resolve().parents[2]
NUMBERS = re.compile(r"\b(out|lse) (max|mean) error (\S+) > (\S+) allowed")


def numbers(text: str) -> set[tuple[str, ...]]:
    return set(NUMBERS.findall(text))


class Triaged(NamedTuple):
    finding: Path  # the finding folder (report.md)
    triage: Path  # triage.md, minimized/
    up: Path  # ISSUE.md, repro.py
    result: Result


@pytest.fixture(scope="module")
def triaged(tmp_path_factory: pytest.TempPathFactory) -> Triaged:
    tmp = tmp_path_factory.mktemp("issue43")
    backend = UserKernel.from_spec(CAP_ALIBI)
    found = check_case(backend, cap_alibi_case("float16", 5.0, 0))
    assert {s.quantity for s in strengths(found.verdict)} == {"out", "lse"}, found.message
    folder = save_finding(found, backend, tmp / "findings", CAP_ALIBI)
    result = CliRunner().invoke(main, ["triage", str(folder), "--kernel", CAP_ALIBI, "--out", str(tmp / "triage"),
                                       "--upstream", str(tmp / "up")])
    assert result.exit_code == 1, result.output
    return Triaged(folder, tmp / "triage", tmp / "up", result)


def _minimized_verdict(triage: Path):  # type: ignore[no-untyped-def]
    outcome = check_case(UserKernel.from_spec(CAP_ALIBI), load_case(triage / "minimized" / "case.json"))
    assert outcome.status == "fail" and outcome.verdict is not None
    return outcome.verdict


def test_every_file_states_the_minimized_cases_numbers(triaged: Triaged) -> None:
    result, up = triaged.result, triaged.up
    (fails,) = [line for line in result.stdout.splitlines() if line.startswith("  fails: ")]
    stated = numbers(fails)
    assert {q for q, *_ in stated} == {"out", "lse"}, fails
    triage_md = (triaged.triage / "triage.md").read_text()
    (minimized,) = [line for line in triage_md.splitlines() if line.startswith("- the minimized case fails: ")]
    issue = (up / "ISSUE.md").read_text()
    wrong = issue.split("## What is wrong", 1)[1].split("The case as given", 1)[0]
    repro = (up / "repro.py").read_text()
    (seen,) = [line for line in repro.splitlines() if line.startswith("SEEN = ")]
    assert numbers(minimized) == numbers(wrong) == numbers(seen) == stated
    verdict_table = triage_md.split("Full verdict report (minimized case)", 1)[1]
    for quantity, _, error, allowed in stated:  # the full verdict's table: the same errors and limits
        assert re.search(rf"\| {quantity} \| {re.escape(error)} \| {re.escape(allowed)} \|", verdict_table), quantity


def test_repro_checks_the_judges_limits_and_prints_the_same_numbers(triaged: Triaged) -> None:
    up = triaged.up
    repro = (up / "repro.py").read_text()
    allowed = json.loads(re.search(r"^ALLOWED = (.*)$", repro, re.M).group(1))
    assert allowed == limits(_minimized_verdict(triaged.triage))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "repro.py"], cwd=up, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "REPRODUCED" in done.stdout, done.stdout + done.stderr
    (seen,) = [line for line in repro.splitlines() if line.startswith("SEEN = ")]
    printed = re.search(r"out max error (\S+) > (\S+) allowed", done.stdout)
    (stated,) = [(e, a) for q, s, e, a in numbers(seen) if (q, s) == ("out", "max")]
    assert [float(x) for x in printed.groups()] == pytest.approx([float(x) for x in stated], rel=5e-3)


def test_the_case_as_given_is_stated_alike_in_report_md_triage_md_and_issue_md(triaged: Triaged) -> None:
    result = triaged.result
    found = numbers((triaged.finding / "report.md").read_text().split("## Case", 1)[0])
    backends_row = (triaged.triage / "triage.md").read_text().split("## Backends", 1)[1].split("## Minimized", 1)[0]
    issue = (triaged.up / "ISSUE.md").read_text()
    (as_given,) = [line for line in issue.splitlines() if line.startswith("- The case as given")]
    assert found and numbers(backends_row) == numbers(as_given) == found
    assert numbers(next(line for line in result.stdout.splitlines() if "DISAGREES" in line)) == found


def test_the_issue_title_names_the_failing_quantities_and_their_ratios(triaged: Triaged) -> None:
    issue = (triaged.up / "ISSUE.md").read_text()
    title = issue.splitlines()[0]
    ratio = {q: float(e) / float(a) for q, _, e, a in numbers(issue.split("## What is wrong", 1)[1].split("\n\n")[1])}
    assert title == (f"# {CAP_ALIBI}: output wrong by {ratio_words(ratio['out'])}x and LSE by {ratio_words(ratio['lse'])}x "
                     "the allowed error when soft cap and ALiBi are both on")
    assert "only the LSE is wrong" not in issue


def test_the_issue_shows_expected_and_actual_values_and_a_call_that_runs(triaged: Triaged) -> None:
    result, up = triaged.result, triaged.up
    issue = (up / "ISSUE.md").read_text()
    rows = re.findall(r"^\| (out|lse) \| request (\d+), token (\d+) \(position -?\d+\), qo head (\d+)[^|]* \| (\S+) \| (\S+) \| (\S+) \|$",
                      issue, re.M)
    assert {r[0] for r in rows} == {"out", "lse"}, issue
    assert all(abs(float(got) - float(expected)) == pytest.approx(float(error), rel=5e-3) for *_, expected, got, error in rows)
    call = re.search(r"## The call\n.*?```python\n(.*?)```", issue, re.S).group(1)
    (up / "call.py").write_text(call + "print(tuple(out.shape), tuple(lse.shape))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "call.py"], cwd=up, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"wrote ISSUE.md: {up / 'ISSUE.md'}" in result.stdout and f"wrote repro.py: {up / 'repro.py'}" in result.stdout
