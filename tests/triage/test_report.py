from __future__ import annotations

import ast
import json

import pytest
from click.testing import CliRunner
from pa_oracle.fuzz.campaign.finding_record import read_finding
from pa_oracle.fuzz.triage import plots
from pa_oracle.fuzz.triage.pipeline import run_triage
from pa_oracle.fuzz.triage.render import pytest_snippet, write_report

from pa_oracle.cli import main

from .conftest import PLANTED, kernel, make_finding, mixed_case


def run_snippet(text: str) -> None:
    ast.parse(text)
    namespace: dict = {}
    exec(compile(text, "<pasted test>", "exec"), namespace)
    tests = [fn for name, fn in namespace.items() if name.startswith("test_")]
    assert len(tests) == 1
    tests[0]()


@pytest.fixture(scope="module")
def triaged(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("triaged")
    finding = read_finding(make_finding(tmp_path, "last_page_off_by_one", mixed_case()))
    result = run_triage(finding.case, finding.case_json, [kernel("correct_attention"), kernel("last_page_off_by_one")], tmp_path / "triage")
    return result, write_report(result, tmp_path / "triage")


def test_survey_names_who_disagrees_and_the_minimized_case_is_saved(triaged) -> None:
    result, _ = triaged
    assert {r.backend: r.status for r in result.survey} == {PLANTED.format("correct_attention"): "pass",
                                                          PLANTED.format("last_page_off_by_one"): "fail"}
    assert result.focus == PLANTED.format("last_page_off_by_one") and result.minimized_path.exists()
    assert [label for label, _ in result.localized] == ["minimized case", "original case"]


def test_report_files_are_written_with_plots(triaged) -> None:
    pytest.importorskip("matplotlib")
    _, written = triaged
    markdown, page = written["markdown"].read_text(), written["html"].read_text()
    for text in (markdown, page):
        assert "off-by-one in the last page length" in text and "pa-oracle replay" in text
    assert "<img" in page and "data:image/png;base64," in page and "src='plots/" not in page
    images = [line.split("](")[1].rstrip(")") for line in markdown.splitlines() if line.startswith("![")]
    assert images and all((written["markdown"].parent / image).stat().st_size > 1000 for image in images)


def test_without_matplotlib_the_report_says_why(triaged, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(plots, "unavailable_reason", lambda: "matplotlib is not installed (test)")
    written = write_report(triaged[0], tmp_path / "plain")
    assert "<img" not in written["html"].read_text()
    assert "No plots: matplotlib is not installed (test)." in written["markdown"].read_text()


def test_the_pasted_regression_test_is_red_now_and_green_when_fixed(triaged) -> None:
    result, written = triaged
    with pytest.raises(AssertionError, match="FAIL"):
        run_snippet(written["test"].read_text())
    fixed = pytest_snippet(result.case_path, PLANTED.format("correct_attention"), PLANTED.format("correct_attention"), "x")
    run_snippet(fixed)
    registered = pytest_snippet(result.case_path, "sdpa-math", None, result.case.case_id)
    assert "get_backend('sdpa-math')" in registered
    run_snippet(registered)


def test_cli_triage_exits_one_and_prints_json(last_page_finding, tmp_path) -> None:
    out = tmp_path / "report"
    args = ["triage", str(last_page_finding), "-b", "sdpa-math", "-k", PLANTED.format("last_page_off_by_one")]
    result = CliRunner().invoke(main, args + ["--out", str(out), "--budget", "15", "--json"])
    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout)
    assert [b["status"] for b in summary["backends"]] == ["pass", "fail"]
    assert summary["focus"] == PLANTED.format("last_page_off_by_one") and summary["minimized"]["runs"] <= 15
    assert (out / "triage.html").exists() and (out / "minimized" / "case.json").exists()


def test_cli_triage_without_minimizing_on_a_passing_backend_exits_zero(last_page_finding, tmp_path) -> None:
    result = CliRunner().invoke(main, ["triage", str(last_page_finding / "case.json"), "-b", "sdpa-math", "--no-minimize",
                                       "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "sdpa-math" in result.output and "agrees" in result.output
    assert "No backend fails this case" in (tmp_path / "r" / "triage.md").read_text()


def test_cli_triage_refuses_a_folder_without_a_case(tmp_path) -> None:
    result = CliRunner().invoke(main, ["triage", str(tmp_path), "-b", "sdpa-math"])
    assert result.exit_code == 2 and "no case.json" in result.output  # bad input (pa_oracle.fuzz.exits), not a finding
