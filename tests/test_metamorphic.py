from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner
from pa_oracle.backends import get_backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
from pa_oracle.fuzz.checks.registry import CHECKS
from pa_oracle.fuzz.checks.metamorphic import RELATIONS, Piece, relabel_pages, window_pieces
from pa_oracle.fuzz.draw.strategies import Limits
from pa_oracle.fuzz.quality import planted
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.reference import reference
from pa_oracle.oracle.tensors import load_case, make_tensors, token_addresses

from pa_oracle.cli import main
from tests.quality import contract_breakers

# four requests: decode, prefill, qo_len above kv_len, no query; pages shuffled, two unused
LAYOUT = Layout.from_lengths([1, 5, 4, 0], [23, 9, 2, 6], 4, page_order=[5, 9, 0, 12, 2, 8, 1, 13, 7, 3, 4, 6, 10, 11], extra_pages=2)
CASE = Case(LAYOUT, Heads(4, 2, 16, 16), Options(causal=True, logits_soft_cap=30.0), seed=11)
SMALL = Limits(max_batch=4, max_kv_len=40, max_qo_len=8, max_kv_heads=2, max_qo_heads=8, head_dims=(8, 16))
RELATION = {r.name: r for r in RELATIONS}


def _sdpa_case() -> Case:
    return CASE.replace(options=Options(causal=True))  # SDPA takes no soft cap


@pytest.mark.parametrize("name", ["reorder", "relabel", "alone", "window"])
def test_relations_hold_on_sdpa_math(name: str) -> None:
    outcome = RELATION[name](get_backend("sdpa-math"), _sdpa_case())
    assert outcome.status == "pass", outcome.message


@pytest.mark.parametrize("kernel", [planted.correct_attention, planted.correct_split_kv, planted.correct_float64])
def test_every_relation_holds_on_correct_kernels_with_lse(kernel) -> None:
    for relation in RELATIONS:
        outcome = relation(UserKernel(kernel), CASE)
        assert outcome.status == "pass", f"{relation.name}: {outcome.message}"


def test_relabel_is_bit_exact_and_merge_is_judged_by_tolerance_on_a_correct_kernel() -> None:
    backend = UserKernel(planted.correct_attention)
    assert RELATION["relabel"](backend, CASE).exact is True
    merge = RELATION["merge"](backend, CASE)
    assert merge.status == "pass" and "allowed" in merge.message


@pytest.mark.parametrize(
    ("relation", "kernel"),
    [
        ("reorder", planted.only_first_request_offsets),
        ("relabel", contract_breakers.ignores_page_table),
        ("alone", contract_breakers.batch_size_dependent),
        ("merge", planted.lse_base_two),
        ("window", planted.window_off_by_one),
    ],
)
def test_each_relation_catches_a_kernel_that_breaks_it(relation: str, kernel) -> None:
    case = CASE
    if relation == "relabel":  # identity page table: the kernel is right here, wrong once pages move
        case = CASE.replace(layout=Layout.from_lengths([1, 5, 4, 0], [23, 9, 2, 6], 4, extra_pages=2))
        assert UserKernel(planted.correct_attention).run(case, make_tensors(case)).out.equal(
            UserKernel(kernel).run(case, make_tensors(case)).out
        )
    outcome = RELATION[relation](UserKernel(kernel), case)
    assert outcome.status == "fail", outcome.message
    assert outcome.worst is not None and outcome.worst.error > 0


def test_relations_that_do_not_apply_say_why() -> None:
    sdpa = get_backend("sdpa-math")
    assert "no LSE" in RELATION["merge"].capabilities(sdpa)
    single = _sdpa_case().replace(layout=Layout.from_lengths([2], [7], 4))
    outcome = RELATION["reorder"](sdpa, single)
    assert outcome.status == "unsupported" and "nothing to reorder" in outcome.message


def test_relabel_pages_moves_contents_with_their_ids() -> None:
    tensors = make_tensors(CASE)
    new_id = list(reversed(range(LAYOUT.num_pages)))
    relabeled, moved = relabel_pages(CASE, tensors, new_id)
    pages, slots = token_addresses(CASE)
    new_pages, new_slots = token_addresses(relabeled)
    assert torch.equal(moved.k_cache[new_pages, new_slots], tensors.k_cache[pages, slots])
    assert torch.equal(moved.v_cache[new_pages, new_slots], tensors.v_cache[pages, slots])
    assert torch.equal(reference(relabeled, moved).out, reference(CASE, tensors).out)


def test_window_pieces_follow_bottom_right_alignment() -> None:
    # request 0: kv 10, qo 3 (positions 7, 8, 9); request 1: kv 2, qo 4 (positions -2, -1, 0, 1)
    lay = Layout.from_lengths([3, 4], [10, 2], 4)
    causal = Case(lay, Heads(1, 1, 8, 8), Options(causal=True, window_left=2))
    spans = [(p.request, p.start, p.stop) for p in window_pieces(causal, keep_empty=True)]
    assert spans == [(0, 5, 8), (0, 6, 9), (0, 7, 10), (1, 0, 0), (1, 0, 0), (1, 0, 1), (1, 0, 2)]
    assert len(window_pieces(causal, keep_empty=False)) == 5
    both_ways = causal.replace(options=Options(causal=False, window_left=2))
    spans = [(p.request, p.start, p.stop) for p in window_pieces(both_ways, keep_empty=True)]
    assert spans == [(0, 5, 10), (0, 6, 10), (0, 7, 10), (1, 0, 2), (1, 0, 2), (1, 0, 2), (1, 0, 2)]
    assert all(isinstance(p, Piece) for p in window_pieces(causal, keep_empty=True))


def test_drawn_cases_hold_on_a_correct_kernel() -> None:
    backend = UserKernel(planted.correct_attention)
    for relation in RELATIONS:
        result = fuzz_backend(backend, CampaignConfig(isolate=False, examples=6, limits=SMALL), check=relation)
        assert result.finding is None, f"{relation.name}: {result.finding.message}"
        assert result.passed >= 3, result.line()


def test_a_violation_is_shrunk_saved_and_replayed(tmp_path) -> None:
    spec = "tests.quality.contract_breakers:ignores_page_table"
    backend = UserKernel.from_spec(spec)
    result = fuzz_backend(backend, CampaignConfig(isolate=False, examples=30, limits=SMALL, out_dir=tmp_path), check=CHECKS["relabel"])
    assert result.finding is not None and result.finding_dir is not None
    original = load_case(result.finding_dir / "original" / "case.json")
    relabeled = load_case(result.finding_dir / "relabeled" / "case.json")
    assert original.layout.kv_lens == relabeled.layout.kv_lens and original.layout.kv_indices != relabeled.layout.kv_indices
    assert original.layout.batch_size == 1, original.summary()  # shrunk
    report = (result.finding_dir / "report.md").read_text()
    assert "relabel VIOLATED" in report and "expected: bit-exact" in report and "pa-oracle metamorphic --case" in report
    replayed = CliRunner().invoke(main, ["metamorphic", "--case", str(result.finding_dir / "original" / "case.json"),
                                         "-c", "relabel", "-k", spec, "--out", str(tmp_path / "again")])
    assert replayed.exit_code == 1, replayed.output
    assert "relabel: VIOLATED" in replayed.output


def test_cli_runs_checks_and_rejects_unknown_ones(tmp_path) -> None:
    ok = CliRunner().invoke(main, ["metamorphic", "-k", "pa_oracle.fuzz.quality.planted:correct_attention", "-c", "reorder",
                                   "-c", "window", "-n", "3", "--out", str(tmp_path), "--only", "max_qo_len=4"])
    assert ok.exit_code == 0, ok.output
    assert "reorder: ok" in ok.output and "window: ok" in ok.output
    bad = CliRunner().invoke(main, ["metamorphic", "-b", "sdpa-math", "-c", "relable"])
    assert bad.exit_code == 2 and "did you mean relabel" in bad.output


def test_derived_cases_keep_fp8_bits() -> None:
    case = CASE.replace(options=Options(causal=True, q_dtype="bfloat16", kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=0.75))
    backend = UserKernel(contract_breakers.correct_with_fp8_scales)
    for name in ("relabel", "window", "merge"):
        outcome = RELATION[name](backend, case)
        assert outcome.status == "pass", f"{name}: {outcome.message}"


def test_merge_without_empty_requests_splits_only_requests_with_keys_before_their_queries() -> None:
    correct, broken = UserKernel(planted.correct_attention), UserKernel(planted.lse_base_two)
    for backend in (correct, broken):
        backend.capabilities = backend.capabilities.replace(empty_requests=False)  # type: ignore[misc]
    case = CASE.replace(layout=Layout.from_lengths([1, 5, 2], [23, 5, 9], 4, extra_pages=1))  # request 1: no key to cut
    held = RELATION["merge"](correct, case)
    assert held.status == "pass" and "{0: " in held.message and "1:" not in held.message.split("(")[0], held.message
    assert RELATION["merge"](broken, case).status == "fail"
