from __future__ import annotations

import json

import pytest
from pa_oracle.fuzz.campaign.ledger import load_ledger, lookup
from pa_oracle.oracle.case import CaseError
from pa_oracle.oracle.tensors import load_case


def write(tmp_path, entries, version=1):
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps({"schema_version": version, "entries": entries}))
    return path


ENTRY = {"case": "c", "backends": ["b"], "versions": {"flashinfer": "1.0"}, "status": "tolerated", "reason": "r", "issue": "https://x/1"}


def test_entries_match_case_backend_and_version(tmp_path) -> None:
    entries = load_ledger(write(tmp_path, [ENTRY]))
    assert lookup(entries, "c", "b", {"flashinfer": "1.0", "torch": "2"}) is not None
    assert lookup(entries, "c", "b", {"flashinfer": "1.1"}) is None  # a new version must pass again
    assert lookup(entries, "c", "other", {"flashinfer": "1.0"}) is None


@pytest.mark.parametrize(
    "change, message",
    [({"status": "xfail"}, "status must be"), ({"issue": ""}, "must cite a reason and an issue URL"), ({"reason": ""}, "must cite")],
)
def test_malformed_entries_are_refused(tmp_path, change, message) -> None:
    with pytest.raises(CaseError, match=message):
        load_ledger(write(tmp_path, [{**ENTRY, **change}]))


def test_unknown_ledger_version_is_refused(tmp_path) -> None:
    with pytest.raises(CaseError, match="unknown ledger schema_version 2"):
        load_ledger(write(tmp_path, [ENTRY], version=2))


def test_known_finding_matches_the_predicate_backend_and_version(tmp_path) -> None:
    from pa_oracle.fuzz.campaign.ledger import known_finding
    from pa_oracle.oracle.case import Case, Heads, Layout, Options

    entries = load_ledger(write(tmp_path, [{**ENTRY, "matches": {"alibi": True, "logits_soft_cap": True, "group_size": [1, 5]}}]))
    both = Options(alibi_slopes=(0.5,), logits_soft_cap=30.0)
    case = Case(Layout.from_lengths([1], [3], 16), Heads(1, 1, 8, 8), both)
    assert known_finding(entries, case, "b", {"flashinfer": "1.0"}) is entries[0]
    assert known_finding(entries, case, "b", {"flashinfer": "1.1"}) is None
    assert known_finding(entries, case, "other", {"flashinfer": "1.0"}) is None
    alibi_only = case.replace(options=Options(alibi_slopes=(0.5,)))
    assert known_finding(entries, alibi_only, "b", {"flashinfer": "1.0"}) is None
    group_2 = Case(Layout.from_lengths([1], [3], 16), Heads(2, 1, 8, 8), Options(alibi_slopes=(0.5, 0.25), logits_soft_cap=30.0))
    assert known_finding(entries, group_2, "b", {"flashinfer": "1.0"}) is None


def test_an_entry_without_a_predicate_matches_no_drawn_case(tmp_path) -> None:
    from pa_oracle.fuzz.campaign.ledger import known_finding
    from pa_oracle.oracle.case import Case, Heads, Layout

    entries = load_ledger(write(tmp_path, [ENTRY]))
    assert known_finding(entries, Case(Layout.from_lengths([1], [0], 16), Heads(1, 1, 8, 8)), "b", {"flashinfer": "1.0"}) is None


@pytest.mark.parametrize(
    "matches, message",
    [
        ({"group_sise": [5]}, "unknown feature 'group_sise'; did you mean group_size"),
        ({"alibi": "yes"}, "alibi: 'yes' is not bool"),
        ({"group_size": [5, True]}, "group_size: True is not int"),
        ({"kv_dtype": "fp8"}, "kv_dtype: 'fp8' is not one of"),
        ({"group_size": []}, "empty list matches nothing"),
        ({}, "non-empty object"),
    ],
)
def test_malformed_predicates_are_refused(tmp_path, matches, message) -> None:
    with pytest.raises(CaseError, match=message):
        load_ledger(write(tmp_path, [{**ENTRY, "matches": matches}]))


@pytest.mark.parametrize(
    "change, message",
    [({"backend": ["b"]}, r"entry 0: backend: unknown field \(known: case, backends"), ({"backends": []}, "non-empty list"), ({"versions": {"x": 1}}, "version strings")],
)
def test_malformed_entry_fields_are_refused(tmp_path, change, message) -> None:
    with pytest.raises(CaseError, match=message):
        load_ledger(write(tmp_path, [{**ENTRY, **change}]))


def test_every_predicate_in_the_ledger_matches_its_own_golden_case() -> None:
    from pa_oracle.fuzz.campaign.ledger import GOLDEN

    with_predicate = [e for e in load_ledger() if e.matches]
    assert with_predicate
    wrong = [e.case for e in with_predicate if not e.matches_case(load_case(GOLDEN / "cases" / f"{e.case}.json"))]
    assert not wrong, f"these ledger predicates do not match their own golden case: {wrong}"
