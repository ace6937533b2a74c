from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from pa_oracle.fuzz.campaign.ledger import GOLDEN, load_ledger, lookup
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.tensors import load_case

from pa_oracle.cli import main

from .conftest import PLANTED, kernel

ISSUE = "https://github.com/example/kernels/issues/7"


@pytest.fixture
def golden(tmp_path) -> Path:
    shutil.copy(GOLDEN / "ledger.json", tmp_path / "ledger.json")
    (tmp_path / "cases").mkdir()
    return tmp_path


def add(finding: Path, golden: Path, *extra: str):
    return CliRunner().invoke(main, ["golden", "add", str(finding), "--golden-dir", str(golden), *extra])


def test_golden_add_round_trips(last_page_finding, golden) -> None:
    before = json.loads((golden / "ledger.json").read_text())
    result = add(last_page_finding, golden, "--name", "planted-last-page", "--reason", "drops the last key", "--issue", ISSUE,
                 "--status", "quarantined")
    assert result.exit_code == 0, result.output
    text = (golden / "ledger.json").read_text()
    after = json.loads(text)
    assert text == json.dumps(after, indent=1) + "\n" and after["entries"][:-1] == before["entries"]
    entry = after["entries"][-1]
    assert entry == {"case": "planted-last-page", "backends": [PLANTED.format("last_page_off_by_one")], "versions": entry["versions"],
                     "status": "quarantine", "reason": "drops the last key", "issue": ISSUE}
    assert "kernel" not in entry["versions"] and "module_file" not in entry["versions"]
    case = load_case(golden / "cases" / "planted-last-page.json")
    assert case.tensors_file == str((golden / "cases" / "planted-last-page.npz").resolve())
    assert case.meta["found_by"]["backend"] == PLANTED.format("last_page_off_by_one")
    # one id wherever the case lies: the golden copy keeps the finding's id (its sidecar's content names it)
    assert case.case_id == load_case(last_page_finding / "case.json").case_id
    assert json.loads((golden / "cases" / "planted-last-page.json").read_text())["case_id"] == case.case_id
    assert check_case(kernel("last_page_off_by_one"), case).status == "fail"
    assert check_case(kernel("correct_attention"), case).status == "pass"
    entries = load_ledger(golden / "ledger.json")
    assert lookup(entries, "planted-last-page", PLANTED.format("last_page_off_by_one"), entry["versions"]) is not None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--issue", ISSUE], "needs --reason"),
        (["--reason", "r"], "needs --issue"),
        (["--reason", "r", "--issue", "#12"], "needs --issue with the URL"),
        (["--reason", "r", "--issue", ISSUE, "--name", "Bad Name!"], "use lowercase letters"),
    ],
)
def test_golden_add_refuses_incomplete_entries(last_page_finding, golden, args, message) -> None:
    result = add(last_page_finding, golden, *args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert not list((golden / "cases").iterdir())


def test_golden_add_never_overwrites(last_page_finding, golden) -> None:
    args = ["--name", "once", "--reason", "r", "--issue", ISSUE]
    assert add(last_page_finding, golden, *args).exit_code == 0
    ledger = (golden / "ledger.json").read_text()
    result = add(last_page_finding, golden, *args)
    assert result.exit_code == 2 and "already exists" in result.output
    assert (golden / "ledger.json").read_text() == ledger


def test_golden_add_refuses_a_folder_that_is_no_finding(golden, tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    result = add(tmp_path / "empty", golden, "--reason", "r", "--issue", ISSUE)
    assert result.exit_code == 2 and "no case.json" in result.output


def test_golden_add_refuses_a_case_whose_tensors_do_not_load(last_page_finding, golden) -> None:
    (last_page_finding / "tensors.npz").write_bytes(b"not an npz")
    result = add(last_page_finding, golden, "--reason", "r", "--issue", ISSUE)
    assert result.exit_code == 2 and "does not load" in result.output
