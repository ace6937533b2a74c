"""A finding keeps its first failing case (``original.json``) beside the minimal one, and triage localizes
on it when the minimal case is ambiguous (issue 35)."""

from __future__ import annotations

import json
from pathlib import Path

from pa_oracle.fuzz.campaign.finding_record import read_meta
from pa_oracle.fuzz.campaign.findings import FIRST_FAILING, FIRST_FAILING_TENSORS, save_finding
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.fuzz.triage.pipeline import run_triage
from pa_oracle.fuzz.triage.render import write_report
from pa_oracle.oracle.tensors import load_case, make_tensors, raw_bits

from .conftest import PLANTED, kernel, mixed_case
from .test_honesty import check, one_key_window_case


def _finding(tmp_path: Path, *, keep_first: bool) -> Path:
    backend = kernel("window_off_by_one")
    first = check_case(backend, mixed_case(window_left=3))
    minimal = check_case(backend, one_key_window_case())
    assert first.status == minimal.status == "fail", (first.message, minimal.message)
    return save_finding(minimal, backend, tmp_path / "findings", PLANTED.format("window_off_by_one"),
                        first=first if keep_first else None)


def test_the_first_failing_case_is_kept_beside_the_minimal_one(tmp_path: Path) -> None:
    folder = _finding(tmp_path, keep_first=True)
    assert load_case(folder / "case.json").layout == one_key_window_case().layout  # case.json stays the minimal one
    larger = load_case(folder / FIRST_FAILING)
    drawn = mixed_case(window_left=3)
    assert (larger.layout, larger.heads, larger.options, larger.seed) == (drawn.layout, drawn.heads, drawn.options, drawn.seed)
    assert (folder / FIRST_FAILING_TENSORS).is_file()
    drawn_tensors, kept = make_tensors(drawn, "cpu").as_dict(), make_tensors(larger, "cpu").as_dict()
    assert drawn_tensors.keys() == kept.keys()
    assert all(raw_bits(drawn_tensors[n]).equal(raw_bits(kept[n])) for n in kept)  # bit for bit (unused slots hold NaN)
    meta = read_meta(json.loads((folder / FIRST_FAILING).read_text())["meta"], FIRST_FAILING)
    assert meta.found_by is not None and meta.found_by.status == "fail" and "before shrinking" in (meta.role or "")


def test_no_first_failing_case_when_it_is_the_minimal_one(tmp_path: Path) -> None:
    backend = kernel("window_off_by_one")
    outcome = check_case(backend, one_key_window_case())
    folder = save_finding(outcome, backend, tmp_path / "findings", first=outcome)
    assert not (folder / FIRST_FAILING).exists()


def test_triage_localizes_on_the_first_failing_case_when_the_minimal_one_is_ambiguous(tmp_path: Path) -> None:
    folder = _finding(tmp_path, keep_first=True)
    result = run_triage(load_case(folder / "case.json"), folder / "case.json", [kernel("window_off_by_one")],
                        tmp_path / "triage", minimize_case=False)
    labels = [label for label, _ in result.localized]
    assert labels == ["original case", f"first failing case, {FIRST_FAILING}"], labels
    assert check(result.localized[0][1], "window edge").result == "ambiguous"
    assert check(result.localized[1][1], "window edge").result == "pattern"
    assert result.localized[1][1].case.layout == mixed_case().layout
    written = write_report(result, tmp_path / "triage")
    assert f"Where the error is (first failing case, {FIRST_FAILING})" in written["markdown"].read_text()


def test_without_original_json_triage_stays_on_the_minimal_case(tmp_path: Path) -> None:
    folder = _finding(tmp_path, keep_first=False)
    assert not (folder / FIRST_FAILING).exists()
    result = run_triage(load_case(folder / "case.json"), folder / "case.json", [kernel("window_off_by_one")],
                        tmp_path / "triage", minimize_case=False)
    assert [label for label, _ in result.localized] == ["original case"]


def test_a_campaigns_finding_keeps_its_first_failing_case(tmp_path: Path) -> None:
    """The engine passes the search's first failing outcome to the finding writer: a shrunk finding keeps it."""
    from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend

    result = fuzz_backend(kernel("window_off_by_one"), CampaignConfig(examples=200, out_dir=tmp_path, isolate=False))
    assert result.finding is not None and result.finding_dir is not None
    minimal = load_case(result.finding_dir / "case.json")
    if (result.finding_dir / FIRST_FAILING).exists():
        first = load_case(result.finding_dir / FIRST_FAILING)
        assert first.case_id != minimal.case_id
        assert sum(first.layout.kv_lens) >= sum(minimal.layout.kv_lens)
    else:  # the first failing case was already minimal: nothing else to keep
        assert result.finding.case.case_id == minimal.case_id
    assert (result.finding_dir / FIRST_FAILING).exists(), "a 200-example search shrinks its first failure"


def test_the_coverage_of_a_run_with_a_finding_counts_the_minimal_case() -> None:
    """The coverage table said 'never ran: group_size 3' on the run whose finding had group size 3: a case judged while
    shrinking was never counted (here the first failure has group 5 and the minimal one group 2)."""
    from pa_oracle.backends.user import UserKernel
    from pa_oracle.fuzz.campaign.coverage import exercised
    from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend

    result = fuzz_backend(UserKernel.from_spec("pa_oracle.fuzz.quality.planted:wrong_gqa_map"), CampaignConfig(examples=200, isolate=True))
    assert result.finding is not None
    for name, value in exercised(result.finding.case).items():
        assert result.coverage.counts.get(name, {}).get(value, 0) >= 1, (name, value, result.coverage.counts.get(name))
