from __future__ import annotations

import pytest
import torch
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.fuzz.campaign.minimize import Signature, minimize, one_step_reductions, signature, smaller
from pa_oracle.fuzz.campaign.workload import Workload, keep_heads, keep_requests, resize
from pa_oracle.oracle.case import Case, Storage
from pa_oracle.oracle.reference import reference
from pa_oracle.oracle.tensors import make_tensors, save_tensors

from .conftest import kernel, mixed_case


def explicit(case: Case, tmp_path) -> Workload:
    save_tensors(make_tensors(case), tmp_path / "t.npz")
    return Workload.from_case(case.replace(tensors_file=str(tmp_path / "t.npz")))


def assert_locally_minimal(backend, result, tmp_path) -> None:
    for description, candidate in one_step_reductions(result.work):
        if not smaller(candidate, result.work) or backend.unsupported_reason(candidate.case):
            continue
        outcome = check_case(backend, candidate.materialize(tmp_path))
        assert not result.signature.reproduced_by(signature(outcome)), f"one more step still fails: {description}"


@pytest.mark.parametrize("data", ["seed", "npz"])
def test_last_page_bug_minimizes_to_a_smaller_case_that_still_fails(data: str, tmp_path) -> None:
    backend, case = kernel("last_page_off_by_one"), mixed_case(causal=True, logits_soft_cap=30.0)
    work = Workload(case) if data == "seed" else explicit(case, tmp_path)
    result = minimize(backend, work, budget=300)
    assert not result.exhausted and result.runs <= 300
    assert smaller(result.work, work) and result.work.case.layout.batch_size == 1, result.work.case.summary()
    assert result.work.case.layout.kv_lens[0] <= 2 and not result.work.case.options.causal
    replay = check_case(backend, result.work.materialize(tmp_path))
    assert replay.status == "fail" and result.signature.reproduced_by(signature(replay)), replay.message
    assert_locally_minimal(backend, result, tmp_path)


def test_a_memory_layout_the_bug_does_not_need_is_dropped(tmp_path) -> None:
    backend = kernel("last_page_off_by_one")
    case = mixed_case().replace(storage=Storage(kv="combined", kv_layout="HND", q="fused_qkv"))
    result = minimize(backend, Workload(case), budget=300)
    assert result.work.case.storage is None and any(s.description.startswith("storage ") for s in result.steps), result.steps
    assert_locally_minimal(backend, result, tmp_path)


def test_gqa_map_bug_keeps_the_heads_it_needs(tmp_path) -> None:
    backend = kernel("wrong_gqa_map")
    result = minimize(backend, Workload(mixed_case()), budget=300)
    heads = result.work.case.heads
    assert (heads.num_kv_heads, heads.group_size) == (2, 2), result.work.case.summary()  # 1 kv head or group 1 hides it
    assert_locally_minimal(backend, result, tmp_path)


def test_budget_bounds_the_kernel_runs() -> None:
    result = minimize(kernel("last_page_off_by_one"), Workload(mixed_case()), budget=4)
    assert result.exhausted and result.runs == 4


def test_a_passing_case_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fail"):
        minimize(kernel("correct_attention"), Workload(mixed_case()))


def test_a_different_failure_kind_does_not_count_as_the_same_bug() -> None:
    target = Signature("fail", frozenset({"out error", "lse error"}))
    assert target.reproduced_by(Signature("fail", frozenset({"out error"})))
    assert not target.reproduced_by(Signature("fail", frozenset({"out error", "empty row out"})))
    assert not target.reproduced_by(Signature("crash", frozenset({"RuntimeError"})))


def _reference(work: Workload):
    return reference(work.case, work.tensors())


def test_explicit_slices_keep_every_surviving_value(tmp_path) -> None:
    work = explicit(mixed_case(), tmp_path)
    full = _reference(work)
    lay = work.case.layout
    kept = keep_requests(work, [2, 0])  # attention is per request: rows must not change
    rows = list(range(lay.qo_indptr[2], lay.qo_indptr[3])) + list(range(lay.qo_indptr[0], lay.qo_indptr[1]))
    assert torch.equal(_reference(kept).out, full.out[rows])
    two_heads = keep_heads(work, [1], [0, 1])  # qo heads 2, 3 on kv head 1
    assert torch.equal(_reference(two_heads).out, full.out[:, 2:4])
    later_queries = resize(work, {2: (1, 3)}, {})  # non-causal: dropping a query changes no other row
    # (the reference buckets by qo_len, so the summation order may differ: float64 rounding only)
    torch.testing.assert_close(_reference(later_queries).out[lay.qo_indptr[2]:], full.out[lay.qo_indptr[2] + 1:], rtol=0, atol=1e-12)
    assert kept.materialize(tmp_path).tensors_file is not None and make_tensors(kept.materialize(tmp_path)).k_cache.isnan().any()
