from __future__ import annotations

import pytest
from pa_oracle.backends import get_backend
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
from pa_oracle.fuzz.checks.plans import PLAN_CHECKS, other_lengths, other_pages, reuse_variants
from pa_oracle.fuzz.draw.strategies import Limits
from pa_oracle.oracle.case import Case, Heads, Layout, Options

from tests.quality.contract_breakers import CachingPlanKernel, LayoutBuffersKernel

CHECK = {c.name: c for c in PLAN_CHECKS}
CASE = Case(
    Layout.from_lengths([1, 4, 2], [21, 7, 13], 4, page_order=[3, 8, 0, 11, 5, 1, 9, 2, 10, 4, 6, 7, 12], extra_pages=1),
    Heads(4, 2, 16, 16), Options(causal=True), seed=4,
)
SMALL = Limits(max_batch=3, max_kv_len=30, max_qo_len=6, max_kv_heads=2, max_qo_heads=4, head_dims=(8,))


def test_plan_reuse_holds_on_sdpa_math_and_catches_a_plan_that_keeps_data() -> None:
    assert CHECK["plan-reuse"](get_backend("sdpa-math"), CASE).status == "pass"
    outcome = CHECK["plan-reuse"](CachingPlanKernel(), CASE)
    assert outcome.status == "fail" and "with a fresh plan it passes" in outcome.message, outcome.message
    assert [label for label, *_ in outcome.cases] == ["original", "run-1"]


def test_reuse_variants_keep_the_layout_and_change_the_data() -> None:
    variants = reuse_variants(CASE)
    assert len({v.layout for v in variants}) == 1 and len({(v.seed, v.distribution) for v in variants}) == len(variants)


def test_layout_b_has_the_same_shapes_and_another_page_table_or_lengths() -> None:
    for make_b, changed in ((other_pages, "kv_indices"), (other_lengths, "kv_lens")):
        b = make_b(CASE).layout
        a = CASE.layout
        assert (len(b.qo_indptr), len(b.kv_indptr), len(b.kv_indices), b.num_pages, b.page_size) == (
            len(a.qo_indptr), len(a.kv_indptr), len(a.kv_indices), a.num_pages, a.page_size
        )
        assert b.qo_lens == a.qo_lens and getattr(b, changed) != getattr(a, changed)
    one_slot = Case(Layout.from_lengths([1, 1], [3, 1], 1), Heads(1, 1, 8, 8))
    moved = other_lengths(one_slot).layout
    assert moved.kv_lens == (2, 2) and len(moved.kv_indices) == 4


def test_a_stale_plan_is_caught_when_the_plan_captured_the_lengths() -> None:
    planned = LayoutBuffersKernel(planned_lengths=True)
    outcome = CHECK["stale-plan-lengths"](planned, CASE)
    assert outcome.status == "fail" and outcome.message.startswith("stale plan"), outcome.message
    assert CHECK["stale-plan-pages"](planned, CASE).status == "pass"  # it reads the page table at run time


def test_a_kernel_that_reads_the_layout_at_run_time_has_no_stale_plan() -> None:
    run_time = LayoutBuffersKernel(planned_lengths=False)
    for name in ("stale-plan-pages", "stale-plan-lengths"):
        outcome = CHECK[name](run_time, CASE)
        assert outcome.status == "pass" and "read at run time" in outcome.message, outcome.message


def test_a_plan_that_is_the_case_has_nothing_to_go_stale() -> None:
    reason = CHECK["stale-plan-lengths"].capabilities(get_backend("sdpa-math"))
    assert isinstance(reason, str) and "host data" in reason


@pytest.mark.parametrize("name", ["plan-reuse", "stale-plan-pages", "stale-plan-lengths"])
def test_drawn_cases_hold_on_a_run_time_layout_kernel(name: str) -> None:
    result = fuzz_backend(LayoutBuffersKernel(planned_lengths=False), CampaignConfig(isolate=False, examples=6, limits=SMALL), check=CHECK[name])
    assert result.finding is None and result.passed >= 3, result.line()


def test_drawn_cases_find_and_shrink_the_stale_plan(tmp_path) -> None:
    result = fuzz_backend(LayoutBuffersKernel(planned_lengths=True), CampaignConfig(isolate=False, examples=20, limits=SMALL, out_dir=tmp_path), check=CHECK["stale-plan-lengths"])
    assert result.finding is not None and result.finding.message.startswith("stale plan")
    assert (result.finding_dir / "layout-b" / "case.json").exists() and (result.finding_dir / "report.md").exists()
    assert result.finding.cases[0][1].layout.batch_size == 1
