"""Triage claims only what its case can show: keys that coincide are "ambiguous", and the options a
failure needs are found by turning each off."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.fuzz.triage.localize import capture, localize
from pa_oracle.fuzz.triage.necessity import necessary_options
from pa_oracle.fuzz.triage.pipeline import run_triage
from pa_oracle.oracle.case import Case, Heads, Layout, Options

from .conftest import kernel, mixed_case


def check(loc, name):
    return next(c for c in loc.checks if c.name == name)


def one_key_window_case() -> Case:
    """kv_len 1, window_left 0: the last key, the first key and the window's left edge are one key."""
    return Case(Layout.from_lengths([1], [1], page_size=4), Heads(2, 1, 16, 16),
                Options(window_left=0, q_dtype="bfloat16", kv_dtype="bfloat16"), seed=1)


def test_at_kv_len_1_the_window_bug_is_ambiguous_not_a_page_or_window_claim() -> None:
    loc = localize(capture(kernel("window_off_by_one"), one_key_window_case()))
    assert loc.status == "fail"
    assert loc.toggles and all({"the last key", "the first key", "the window's left edge"} <= set(t.labels) for t in loc.toggles)
    window, page = check(loc, "window edge"), check(loc, "page boundary")
    assert window.result == "ambiguous" and page.result == "ambiguous", (window, page)
    assert "cannot tell window edge from first key, page boundary" in window.finding
    assert "cannot tell page boundary from first key, window edge" in page.finding
    assert not [c for c in loc.checks if c.result == "pattern" and c.name in ("window edge", "page boundary")]


def test_a_larger_witness_separates_the_window_edge_from_the_last_key() -> None:
    loc = localize(capture(kernel("window_off_by_one"), mixed_case(window_left=3)))
    assert check(loc, "window edge").result == "pattern"
    assert check(loc, "page boundary").result != "pattern"


def test_the_last_page_bug_stays_a_page_pattern_when_the_last_key_is_nothing_else() -> None:
    loc = localize(capture(kernel("last_page_off_by_one"), mixed_case()))
    assert check(loc, "page boundary").result == "pattern"


def test_soft_cap_after_masking_needs_the_soft_cap_and_the_window() -> None:
    backend = kernel("soft_cap_after_masking")
    case = mixed_case(window_left=3, logits_soft_cap=5.0, causal=True)
    assert check_case(backend, case).status == "fail"
    needed = necessary_options(case, backend, partial(check_case, backend))
    assert needed.result == "pattern", needed
    assert needed.finding.startswith("the failure needs window and soft cap"), needed.finding
    assert "with causal off it still fails" in needed.finding  # the window alone masks keys
    assert set(needed.evidence) == {"causal off: fail", "window off: pass", "soft cap off: pass"}


def test_the_window_bug_needs_only_the_window() -> None:
    backend = kernel("window_off_by_one")
    case = mixed_case(window_left=3, logits_soft_cap=5.0)
    needed = necessary_options(case, backend, partial(check_case, backend))
    assert needed.finding == "the failure needs window: turning it off makes it pass; with soft cap off it still fails"


def test_a_bug_no_option_causes_says_so() -> None:
    backend = kernel("last_page_off_by_one")
    needed = necessary_options(mixed_case(logits_soft_cap=5.0), backend, partial(check_case, backend))
    assert needed.result == "no pattern" and "fails with each one off" in needed.finding
    assert necessary_options(mixed_case(), backend, partial(check_case, backend)).result == "n/a"


def test_triage_reports_the_options_needed(tmp_path: Path) -> None:
    backend = kernel("soft_cap_after_masking")
    case = mixed_case(window_left=3, logits_soft_cap=5.0)
    result = run_triage(case, tmp_path / "case.json", [backend], tmp_path / "out", minimize_case=False)
    ((_, loc),) = result.localized
    assert check(loc, "options needed").finding.startswith("the failure needs window and soft cap")
