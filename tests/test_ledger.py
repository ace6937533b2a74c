from __future__ import annotations

import json

import pytest

from fuzz.ledger import load_ledger, lookup
from oracle.case import CaseError


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
