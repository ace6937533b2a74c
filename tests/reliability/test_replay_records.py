"""``replay-compare`` reads its records strictly (issue 31): a record that is not what ``replay --json``
writes is exit 2 naming the file and the field, never "0 regressed" and never exit 3."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from pa_oracle.fuzz.campaign.replay import REPLAY_KIND, Record, ReplayError, compare, load_replay, replay_document

from pa_oracle.cli import main

TRACEBACK = "Traceback (most recent call last)"
ENV = {"python": "3.12.0", "torch": "2.8.0", "gpu": None, "packages": {"torch": "2.8.0"}, "unavailable": {"flex": "no"}}


def records(*statuses: str) -> dict:
    rows = [Record(f"case{i}", f"golden/cases/case{i}.json", f"{i:012x}", "sdpa-math", "sdpa", status, "", "pass", "",
                   {"torch": "2.8.0"}) for i, status in enumerate(statuses)]
    return json.loads(json.dumps(replay_document(rows, ENV)))


def compare_cli(tmp_path: Path, before: object, after: object) -> tuple[Result, Path, Path]:
    a, b = tmp_path / "before.json", tmp_path / "after.json"
    a.write_text(before if isinstance(before, str) else json.dumps(before))
    b.write_text(after if isinstance(after, str) else json.dumps(after))
    return CliRunner().invoke(main, ["replay-compare", str(a), str(b)]), a, b


def test_a_record_as_replay_writes_it_compares(tmp_path) -> None:
    result, _, _ = compare_cli(tmp_path, records("pass", "fail"), records("fail", "pass"))
    assert result.exit_code == 1 and "REGRESSED case0 on sdpa-math: pass -> fail" in result.output, result.output
    assert "1 regressed, 1 fixed, 0 same" in result.output


def edited(edit):  # type: ignore[no-untyped-def]
    data = records("pass", "fail")
    edit(data)
    return data


def results(data: dict) -> list:
    return data["results"]


HOSTILE = [
    # (edit of the "after" record, the field named, what is said)
    (lambda d: results(d).append(copy.deepcopy(results(d)[0])), "results[2]",
     "case 'case0' on 'sdpa-math' again (first at results[0])"),
    (lambda d: results(d).append({**results(d)[0], "status": "fail"}), "results[2]",
     "case 'case0' on 'sdpa-math' again (first at results[0])"),
    (lambda d: results(d)[0].update(status="PASS"), "results[0].status", "invalid value 'PASS' (one of 'crash', 'error', 'fail', 'pass'"),
    (lambda d: results(d)[1].update(status="Fail"), "results[1].status", "invalid value 'Fail'"),
    (lambda d: results(d)[0].update(status="passed"), "results[0].status", "invalid value 'passed'"),
    (lambda d: results(d)[0].update(status=1), "results[0].status", "expected str, got int 1"),
    (lambda d: results(d)[0].update(ledger="KNOWN"), "results[0].ledger", "invalid value 'KNOWN'"),
    (lambda d: results(d).append({**results(d)[0], "backend": "flex", "case_id": "00000000000f"}), "results[2].case_id",
     "case 'case0' is 00000000000f here but 000000000000 at results[0]: one name, two cases"),
    (lambda d: results(d)[0].update(case_id="ABC"), "results[0].case_id", "expected str matching regex"),
    (lambda d: results(d)[0].update(case=""), "results[0].case", "expected str of length >= 1"),
    (lambda d: results(d)[0].pop("backend"), "results[0].backend", "missing (required)"),
    (lambda d: results(d)[0].update(verdict="ok"), "results[0].verdict", "unknown field"),
    (lambda d: d.update(results={"case0": results(d)[0]}), "results", "expected list, got object"),
    (lambda d: d["results"].__setitem__(0, list(results(d)[0].items())), "results[0]", "expected object, got list"),
    (lambda d: d.update(environment=[]), "environment", "expected object, got list"),
    (lambda d: d["environment"].update(packages=[["torch", "2.8.0"]]), "environment.packages", "expected object, got list"),
    (lambda d: d["environment"].update(packages={"torch": 2.8}), "environment.packages.torch", "expected str, got float 2.8"),
    (lambda d: results(d)[0].update(versions=["2.8.0"]), "results[0].versions", "expected object, got list"),
    (lambda d: results(d)[0].update(message=[[["deep"]]]), "results[0].message", "expected str, got list"),
    (lambda d: d.update(extra=1), "extra", "unknown field"),
]


@pytest.mark.parametrize("edit, field, says", HOSTILE, ids=[f"{f}: {s}" for _, f, s in HOSTILE])
def test_a_hostile_record_is_exit_2_naming_file_and_field(tmp_path, edit, field, says) -> None:  # type: ignore[no-untyped-def]
    result, _, after = compare_cli(tmp_path, records("pass", "fail"), edited(edit))
    assert result.exit_code == 2, result.output
    assert f"{after}: {field}: {says}" in result.output, result.output
    assert TRACEBACK not in result.output and "regressed" not in result.output


@pytest.mark.parametrize("text, says", [
    ("[" * 100_000 + "]" * 100_000, "not valid JSON (nested too deeply)"),
    ('{"results": ' + "[" * 100_000 + "]" * 100_000 + "}", "not valid JSON (nested too deeply)"),
    ('{"schema_version": 1, "schema_version": 1}', "not valid JSON (key 'schema_version' given twice)"),
    ('{"schema_version": true, "kind": "pa-oracle-replay", "results": []}', "not a pa-oracle replay record"),
    ("", "not valid JSON"),
    ("\xff\xfe", "not valid JSON"),
], ids=["deep list", "deep results", "duplicate key", "bool version", "empty", "not utf-8"])
def test_a_file_that_is_no_record_is_exit_2_naming_it(tmp_path, text, says) -> None:  # type: ignore[no-untyped-def]
    after = tmp_path / "after.json"
    after.write_bytes(text.encode("latin-1") if text.startswith("\xff") else text.encode())
    (tmp_path / "before.json").write_text(json.dumps(records("pass")))
    result = CliRunner().invoke(main, ["replay-compare", str(tmp_path / "before.json"), str(after)])
    assert result.exit_code == 2 and f"{after}: {says}" in result.output, result.output
    assert TRACEBACK not in result.output


def test_a_case_changed_between_the_records_is_exit_2_naming_both(tmp_path) -> None:
    after = records("pass", "fail")
    after["results"][1]["case_id"] = "00000000000f"
    result, before_path, after_path = compare_cli(tmp_path, records("pass", "fail"), after)
    assert result.exit_code == 2, result.output
    text = result.output.replace("\n", " ")
    assert f"{after_path}: results[1].case_id: case 'case1' is 00000000000f here but 000000000001 in {before_path}" in text, text
    assert "regressed" not in result.output


def test_load_replay_keeps_a_hand_made_minimal_record_and_compare_names_the_files(tmp_path) -> None:
    minimal = {"schema_version": 1, "kind": REPLAY_KIND, "results": [{"case": "a", "backend": "k", "status": "pass"}]}
    (tmp_path / "m.json").write_text(json.dumps(minimal))
    loaded = load_replay(tmp_path / "m.json")
    assert loaded == minimal and [c.kind for c in compare(loaded, loaded)] == ["same"]
    (tmp_path / "r.json").write_text(json.dumps(records("pass")))
    (tmp_path / "s.json").write_text(json.dumps({**records("pass"), "results": [{**records("pass")["results"][0], "case_id": "0000000000ff"}]}))
    with pytest.raises(ReplayError, match=f"^{tmp_path / 's.json'}: results\\[0\\].case_id: .* in {tmp_path / 'r.json'}"):
        compare(load_replay(tmp_path / "r.json"), load_replay(tmp_path / "s.json"))
