from __future__ import annotations

import pytest
from pa_oracle.backends import discover
from pa_oracle.fuzz.campaign.ledger import golden_cases, load_ledger, lookup
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.tensors import load_case

LEDGER = load_ledger()


@pytest.mark.parametrize("backend_name", sorted(discover()))
@pytest.mark.parametrize("case_path", golden_cases(), ids=lambda p: p.stem)
def test_golden_case(case_path, backend_name: str) -> None:
    backend = discover()[backend_name]()
    reason = backend.unavailable_reason()
    if reason:
        pytest.skip(f"{backend_name}: {reason}")
    entry = lookup(LEDGER, case_path.stem, backend_name, backend.versions())
    if entry and entry.status == "quarantine":
        pytest.skip(f"quarantined: {entry.reason} ({entry.issue})")
    outcome = check_case(backend, load_case(case_path))
    if outcome.status == "unsupported":
        pytest.skip(outcome.message)
    if entry:
        assert outcome.is_finding, f"{backend_name} now passes {case_path.stem}: remove its ledger entry ({entry.issue})"
    else:
        assert outcome.status == "pass", f"{backend_name} on {case_path.stem}: {outcome.message}"


def test_every_ledger_entry_names_a_golden_case() -> None:
    names = {p.stem for p in golden_cases()}
    assert LEDGER and all(entry.case in names for entry in LEDGER)
