from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, seed
from pa_oracle.backends import get_backend
from pa_oracle.backends.base import Capabilities
from pa_oracle.backends.flashinfer_mask import effective_masks
from pa_oracle.backends.user import UserKernel, capabilities_of
from pa_oracle.fuzz.draw.strategies import Limits, cases, variant_keys
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import Case, CustomMask, Heads, Layout, Options
from pa_oracle.oracle.tensors import make_tensors

LAYOUT = Layout.from_lengths([4, 3], [9, 3], page_size=2, page_order=[5, 4, 3, 2, 1, 0, 6])
TREE = CustomMask(tree_parents=((-1, 0, 0, 1), (-1, -1, 1)))
SINKS = (0.0, 1.0, -2.0, 4.0)


@settings(max_examples=50, deadline=None)
@given(case=cases())
def test_default_capabilities_draw_no_family_case(case: Case) -> None:
    assert case.custom_mask is None and not case.heads.mla


def test_a_kernel_without_the_flags_is_given_no_family_case() -> None:
    caps = Capabilities()
    assert "custom_mask=True" in caps.unsupported_reason(Case(LAYOUT, Heads(2, 1, 8, 8), custom_mask=TREE))
    assert "mla=True" in caps.unsupported_reason(Case(LAYOUT, Heads(2, 1, 12, 8, mla=True)))
    assert "mla dims" in caps.replace(mla=(True,), mla_dims=((576, 512),)).unsupported_reason(Case(LAYOUT, Heads(2, 1, 12, 8, mla=True)))


def test_a_user_kernel_naming_custom_mask_gets_flashinfers_packed_form() -> None:
    seen = {}

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, custom_mask, mask_indptr):  # type: ignore[no-untyped-def]
        seen.update(custom_mask=custom_mask, mask_indptr=mask_indptr)
        return torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype)

    assert capabilities_of(kernel).custom_mask == (False, True)
    backend = UserKernel(kernel)
    case = Case(LAYOUT, Heads(2, 1, 8, 8), custom_mask=TREE)
    backend.run(backend.plan(case), make_tensors(case))
    assert seen["mask_indptr"].tolist() == [0, 5, 7]  # 36 bits -> 5 bytes, 9 bits -> 2 bytes
    bits = np.unpackbits(seen["custom_mask"][:5].numpy(), bitorder="little")[:36]
    assert bits.tolist() == case.masks()[0].reshape(-1).tolist()
    backend.run(backend.plan(case.replace(custom_mask=None)), make_tensors(case))
    assert seen["custom_mask"] is None and seen["mask_indptr"] is None

    def takes_all(q, k_cache, v_cache, **kwargs):  # type: ignore[no-untyped-def]
        return q

    assert capabilities_of(takes_all).custom_mask == (False,)  # as before the families: its seeds draw the same


def test_flashinfer_mask_folds_causal_into_the_mask() -> None:
    arbitrary = CustomMask.from_dense([np.ones((4, 9), bool), np.ones((3, 3), bool)])
    case = Case(LAYOUT, Heads(2, 1, 8, 8), Options(causal=True), custom_mask=arbitrary)
    first, second = effective_masks(case)
    assert first.tolist() == [[j <= 5 + i for j in range(9)] for i in range(4)]
    assert second.tolist() == np.tril(np.ones((3, 3), bool)).tolist()


@pytest.mark.parametrize(
    "case",
    [
        Case(LAYOUT, Heads(4, 2, 8, 8), Options(causal=True), seed=1, custom_mask=TREE),
        Case(LAYOUT, Heads(4, 2, 8, 8), Options(sinks=SINKS, window_left=3), seed=2,
             custom_mask=CustomMask.from_dense([np.random.default_rng(0).random((4, 9)) < 0.5, np.eye(3, dtype=bool)])),
        Case(LAYOUT, Heads(4, 1, 12, 8, mla=True), Options(causal=True, sinks=SINKS), seed=3),
    ],
    ids=["tree", "arbitrary+window+sinks", "mla+sinks"],
)
def test_flex_families_passes_on_cpu(case: Case) -> None:
    outcome = check_case(get_backend("flex-families"), case)
    assert outcome.status == "pass", outcome.message


def test_flex_families_is_caught_when_the_mask_is_dropped() -> None:
    backend = get_backend("flex-families")
    case = Case(LAYOUT, Heads(4, 2, 8, 8), seed=1, custom_mask=TREE)
    plan = backend.plan(case)
    plan["mask"] = torch.ones_like(plan["mask"])  # every bit allowed: the tree is ignored
    tensors = make_tensors(case)
    from pa_oracle.fuzz.run.runner import judge

    assert not judge(case, tensors, backend.run(plan, tensors)).passed


def test_family_strategies_draw_trees_masks_and_mla_within_capabilities() -> None:
    caps = get_backend("flex-families").capabilities
    seen = set()

    @seed(0)  # a coverage claim over 80 draws: random seeds missed a kind about 1 run in 6
    @settings(max_examples=80, deadline=None, database=None)
    @given(case=cases(caps, Limits(max_batch=3, max_kv_len=20)))
    def draw(case: Case) -> None:
        assert caps.unsupported_reason(case) is None
        kind = None if case.custom_mask is None else ("tree" if case.custom_mask.tree_parents else "bits")
        seen.add((case.heads.mla, kind))

    draw()
    assert {(False, None), (True, None), (False, "tree"), (False, "bits"), (True, "tree")} <= seen


def test_flex_families_compiles_once_per_shape_signature() -> None:
    """Cases of one compile key that differ in every option, the mask, the sinks, the batch and the
    lengths run on the first case's compiled kernel: a Python value in the mods would be a guard."""
    backend = get_backend("flex-families")
    heads = Heads(4, 2, 8, 8)
    first = Case(LAYOUT, heads, Options(causal=True), seed=1, custom_mask=TREE)
    others = [
        Case(LAYOUT, heads, Options(sinks=SINKS, window_left=3, logits_soft_cap=5.0, sm_scale=0.3), seed=2),
        Case(Layout.from_lengths([1, 2, 5], [7, 2, 30], 4), heads, Options(window_left=0), seed=3),
        Case(Layout.from_lengths([3], [3], 2), heads, Options(causal=True), seed=4,
             custom_mask=CustomMask.from_dense([np.eye(3, dtype=bool)])),
    ]
    assert {backend.compile_key(c) for c in [first, *others]} == {backend.compile_key(first)}
    assert check_case(backend, first).status == "pass"
    frames = torch._dynamo.utils.counters["frames"]["ok"]
    for case in others:
        outcome = check_case(backend, case)
        assert outcome.status == "pass", outcome.message
    assert torch._dynamo.utils.counters["frames"]["ok"] == frames  # nothing compiled again


def test_flex_families_draws_inside_mla_and_plain_keys() -> None:
    backend = get_backend("flex-families")
    keys = variant_keys(backend.capabilities, Limits(), backend.compile_fields)
    mla = [k for k in keys if dict(k)["mla"]][:2]
    plain = [k for k in keys if not dict(k)["mla"]][:2]
    assert mla and plain and all(dict(k)["num_kv_heads"] == 1 for k in mla)
    drawn = [c for key in (mla, plain) for c in _draw_all(cases(backend.capabilities, Limits(), variants=key))]
    assert {backend.compile_key(c) for c in drawn} == set(mla + plain)
    assert {c.heads.mla for c in drawn} == {True, False}


def _draw_all(strategy) -> list[Case]:  # type: ignore[no-untyped-def]
    drawn: list[Case] = []

    @seed(5)
    @settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(case: Case) -> None:
        drawn.append(case)

    collect()
    return drawn
