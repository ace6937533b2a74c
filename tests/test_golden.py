from __future__ import annotations

import warnings

import pytest
from pa_oracle.backends import discover
from pa_oracle.fuzz.campaign.ledger import check_mismatches, golden_cases, golden_check, ledger_verdict, load_ledger, lookup
from pa_oracle.fuzz.checks.registry import ALL_CHECKS
from pa_oracle.oracle.tensors import load_case

LEDGER = load_ledger()


class FixedUpstream(UserWarning):
    """A golden case that its ledger entry's versions cover no longer fails here: fixed upstream."""


@pytest.mark.parametrize("backend_name", sorted(discover()))
@pytest.mark.parametrize("case_path", golden_cases(), ids=lambda p: p.stem)
def test_golden_case(case_path, backend_name: str) -> None:
    backend = discover()[backend_name]()
    reason = backend.unavailable_reason()
    if reason:
        pytest.skip(f"{backend_name}: {reason}")
    case = load_case(case_path)
    check_name = golden_check(case, case_path)  # the oracle, or the check whose finding the case is
    check = ALL_CHECKS[check_name]
    versions, family = backend.versions(), backend.kernel_family
    entry = lookup(LEDGER, case_path.stem, backend_name, versions, family, check_name)
    if entry and entry.status == "quarantine":
        pytest.skip(f"quarantined: {entry.reason} ({entry.tracked_at})")
    applies = check.capabilities(backend)
    if isinstance(applies, str):
        pytest.skip(f"{check_name}: {applies}")
    outcome = check.judge(case, backend)
    if outcome.status == "unsupported":
        pytest.skip(outcome.message)
    verdict = ledger_verdict(LEDGER, case_path.stem, backend_name, versions, outcome.status, family, check_name)
    if verdict.kind == "fixed":  # loud, not a silent pass: the README's findings table says fixed in which version
        warnings.warn(FixedUpstream(f"{backend_name} on {case_path.stem}: {verdict.message}"), stacklevel=1)
    assert verdict.ok, f"{backend_name} on {case_path.stem} ({check_name}): {verdict.message}: {outcome.message}"


def test_every_ledger_entry_names_a_golden_case_judged_by_its_check() -> None:
    checks = {p.stem: golden_check(load_case(p), p) for p in golden_cases()}
    assert LEDGER and all(entry.case in checks for entry in LEDGER)
    assert not check_mismatches(LEDGER, checks)


def test_converted_conventions_stay_golden_cases_that_must_pass() -> None:
    names = {p.stem for p in golden_cases()}
    converted = {"flash-attn-kvcache-alibi-lse", "flash-attn-kvcache-paged-alibi-lse"}
    assert converted <= names and not converted & {e.case for e in LEDGER}
