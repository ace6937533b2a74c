"""The one finding record (``pa_oracle.fuzz.campaign.finding_record``): every golden case and every older shape
of a finding's meta reads into it, ids unchanged; what the campaign, triage and golden write is its one shape;
bad meta is bad input naming the file and the field as the file spells it (issue 32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.finding_record import (
    FindingError,
    FindingMeta,
    FoundBy,
    GeneratedFrom,
    holds_finding,
    read_finding,
    read_meta,
)
from pa_oracle.fuzz.campaign.findings import save_finding, save_unjudged
from pa_oracle.fuzz.campaign.replay import ReplayError, replay_corpus
from pa_oracle.fuzz.run.runner import Outcome
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.errors import BadInput

from pa_oracle.cli import main

GOLDEN_CASES = sorted((Path(__file__).resolve().parents[1] / "golden" / "cases").glob("*.json"))
GQA_BUG = "pa_oracle.fuzz.quality.planted:wrong_gqa_map"
FLAT = {"found_by": "pa-oracle fuzz", "backend": "sdpa-math", "kernel": None, "status": "fail", "message": "FAIL: x",
        "versions": {"torch": "2.11.0"}, "date": "2026-11-30", "generated_from": {"seed": 0, "distribution": "normal"}}
RECORD = FindingMeta(found_by=FoundBy(command="pa-oracle fuzz", backend="sdpa-math", status="fail", message="FAIL: x",
                                      versions={"torch": "2.11.0"}, date="2026-11-30",
                                      generated_from=GeneratedFrom(0, "normal")))


def _case() -> Case:
    return Case(Layout((0, 2), (0, 1), (0,), (3,), 4, 1), Heads(4, 2, 16, 16), Options(causal=True), seed=2)


def _case_file(folder: Path, meta: object) -> Path:
    data = _case().to_json()
    data["meta"] = meta
    path = folder / "case.json"
    path.write_text(json.dumps(data))
    return path


def test_the_corpus_has_both_older_shapes() -> None:
    shapes = {type(json.loads(p.read_text())["meta"]["found_by"]).__name__ for p in GOLDEN_CASES}
    assert shapes == {"str", "dict"}, shapes  # the tests below read both


@pytest.mark.parametrize("path", GOLDEN_CASES, ids=lambda p: p.stem)
def test_every_golden_case_reads_into_the_record_and_keeps_its_id(path: Path) -> None:
    data = json.loads(path.read_text())
    meta = read_meta(data["meta"], path)
    assert meta.found_by is not None and meta.found_by.command and meta.guards
    assert read_meta(meta.to_json(), path) == meta  # written in the one shape, read back the same
    found = data["meta"]["found_by"]
    if isinstance(found, dict):  # a finding promoted before: its flat meta, nested
        assert (meta.backend, meta.found_by.status, meta.found_by.message) == (found["backend"], found["status"], found["message"])
        assert meta.found_by.versions == found["versions"] and meta.found_by.command == found["found_by"]
    assert meta.check == data["meta"].get("check")
    rewritten = {**data, "meta": meta.to_json()}
    assert Case.from_json(rewritten).case_id == Case.from_json(data).case_id == data["case_id"]  # the id ignores the meta


def test_a_check_named_in_an_older_command_is_read_as_the_check() -> None:
    meta = read_meta({**FLAT, "found_by": "pa-oracle metamorphic --check mask-replan"}, "case.json")
    assert meta.found_check == "mask-replan" and meta.check is None  # found by it; replay's own check unset
    assert read_meta(FLAT, "case.json").found_check == "oracle"


def test_the_older_flat_and_nested_shapes_and_the_current_one_are_one_record() -> None:
    nested = {"guards": "g", "source": "s", "found_by": FLAT}
    assert read_meta(FLAT, "case.json") == RECORD
    assert read_meta(nested, "case.json") == RECORD.replace(guards="g", source="s")
    assert read_meta(RECORD.to_json(), "case.json") == RECORD
    assert RECORD.to_json()["found_by"]["command"] == "pa-oracle fuzz" and "check" not in RECORD.to_json()["found_by"]
    assert read_meta({}, "case.json") == FindingMeta() and read_meta({"check": "mask-replan"}, "x").check == "mask-replan"


@pytest.mark.parametrize(("meta", "field"), [
    ({**FLAT, "status": "failed"}, "meta.status: invalid value 'failed'"),
    ({**FLAT, "versions": {"torch": 2}}, "meta.versions.torch: expected str, got int"),
    ({"found_by": {**FLAT, "date": "yesterday"}}, "meta.found_by.date: expected str matching"),
    ({"found_by": {**FLAT, "found_by": 3}}, "meta.found_by.found_by: expected str | null, got int 3"),
    ({"found_by": {"command": "x", "bogus": 1}}, "meta.found_by.bogus: unknown field (known: command,"),
    ({"found_by": {"command": "x"}, "backend": "b"}, "meta.backend: unknown field"),
    ({"guard": "typo"}, "meta.guard: unknown field (known: found_by, check,"),
    ({"found_by": 7}, "meta.found_by: expected object | null, got int 7"),
    ({"found_by": "pa-oracle metamorphic --check "}, "meta.found_by: expected str of length >= 1"),
    ({"found_by": {"found_by": "pa-oracle metamorphic --check "}}, "meta.found_by.found_by: expected str of length >= 1"),
])
def test_bad_meta_names_the_file_and_the_field_as_the_file_spells_it(meta: dict, field: str) -> None:
    with pytest.raises(FindingError, match=None) as caught:
        read_meta(meta, "out/x/case.json")
    assert str(caught.value).startswith(f"out/x/case.json: {field}"), str(caught.value)
    assert isinstance(caught.value, BadInput)


def test_a_record_that_would_not_read_back_is_never_written() -> None:
    with pytest.raises(ValueError, match="meta.found_by.versions.torch") as caught:
        FindingMeta(found_by=FoundBy(command="x", versions={"torch": 2})).to_json()  # type: ignore[dict-item]
    assert not isinstance(caught.value, BadInput)  # the tool's error (exit 3), not the user's


@pytest.mark.parametrize("command", [["triage", "--no-minimize", "-b", "sdpa-math"], ["replay", "-b", "sdpa-math"],
                                     ["golden", "report", "-b", "sdpa-math", "--out", "r"]])
def test_the_commands_refuse_a_case_with_bad_meta_with_exit_2(tmp_path: Path, command: list[str]) -> None:
    path = _case_file(tmp_path, {**FLAT, "status": "failed"})
    where = {"triage": [str(path)], "replay": [str(path), str(path)], "golden": [str(path)]}[command[0]]
    args = command[:2] + where + command[2:] if command[0] == "golden" else command[:1] + where + command[1:]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert f"{path}: meta.status: invalid value 'failed'" in result.output and "Traceback" not in result.output


def test_a_saved_finding_is_the_record_and_reads_back_from_its_folder(tmp_path: Path) -> None:
    backend = UserKernel.from_spec(GQA_BUG)
    folder = save_finding(Outcome(_case(), backend.name, "fail", "FAIL: out off\nmore"), backend, tmp_path, GQA_BUG)
    finding = read_finding(folder)
    assert finding.case_json == folder / "case.json" and finding.case.case_id == folder.name
    found = finding.meta.found_by
    assert found is not None and (found.command, found.check, found.kernel, found.status, found.message) == (
        "pa-oracle fuzz", "oracle", GQA_BUG, "fail", "FAIL: out off")
    assert found.generated_from == GeneratedFrom(2, "normal") and found.versions["kernel"] == GQA_BUG
    assert set(json.loads((folder / "case.json").read_text())["meta"]) == {"found_by"}  # nothing beside it


def test_a_checks_finding_folder_reads_its_original_case(tmp_path: Path) -> None:
    backend = UserKernel.from_spec(GQA_BUG)
    other = _case().replace(seed=3)
    outcome = Outcome(_case(), backend.name, "fail", "relabelled differs", check="relabel",
                      cases=[("original", _case(), None), ("relabelled", other, None)])
    folder = save_finding(outcome, backend, tmp_path)
    finding = read_finding(folder)
    assert finding.case_json == folder / "original" / "case.json" and finding.meta.role == "original"
    assert finding.meta.found_check == "relabel" and finding.meta.check is None
    assert read_finding(folder / "relabelled").meta.role == "relabelled"


def test_an_unjudged_case_records_the_check_replay_judges_it_through(tmp_path: Path) -> None:
    backend = UserKernel.from_spec(GQA_BUG)
    folder = save_unjudged(Outcome(_case(), backend.name, "error", "oracle broke", check="relabel"), backend, tmp_path)
    meta = read_finding(folder).meta
    assert meta.check == "relabel" and meta.found_by is not None and meta.found_by.status == "error"
    assert meta.found_by.command == "pa-oracle (the oracle could not judge this case)"


def test_a_folder_saved_in_the_older_shape_on_another_day_is_the_same_finding(tmp_path: Path) -> None:
    backend = UserKernel.from_spec(GQA_BUG)
    outcome = Outcome(_case(), backend.name, "fail", "FAIL: out off")
    folder = save_finding(outcome, backend, tmp_path)
    data = json.loads((folder / "case.json").read_text())
    found = data["meta"]["found_by"]
    flat = {"found_by": found.pop("command"), **{k: v for k, v in found.items() if k != "check"}, "date": "2020-01-01"}
    (folder / "case.json").write_text(json.dumps({**data, "meta": flat}))
    assert not holds_finding(folder / "case.json", _case())  # no sidecar named: not this saved case
    assert save_finding(outcome, backend, tmp_path) == folder  # not saved again beside it as NAME-2
    crash = save_finding(Outcome(_case(), backend.name, "crash", "RuntimeError"), backend, tmp_path)
    assert crash == folder.with_name(folder.name + "-2")  # another verdict is another finding


def test_a_folder_without_a_case_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(FindingError, match=f"{tmp_path}: not a finding folder: it has no case.json"):
        read_finding(tmp_path)


def test_replay_refuses_a_corpus_case_with_bad_meta(tmp_path: Path) -> None:
    path = _case_file(tmp_path, {"found_by": {"command": "x", "status": "nope"}})
    with pytest.raises(ReplayError, match=f"{path}: meta.found_by.status: invalid value 'nope'"):
        replay_corpus([path], [], [], lambda backend, check: None)
