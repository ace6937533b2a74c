from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pa_oracle.backends.base import Capabilities
from pa_oracle.fuzz.draw.families import tree_parents
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.oracle.case import KV_DTYPES, Case, CaseError, CustomMask, Heads, Layout, Options, flashinfer_packed_mask
from pa_oracle.oracle.reference import plain_attention, reference
from pa_oracle.oracle.tensors import Tensors, make_tensors, save_tensors, load_tensors

from tests.oracle.naive import naive_attention
from tests.oracle.test_reference import _sdpa_fp64

MASKED = Capabilities(kv_dtypes=KV_DTYPES, custom_mask=(True,), mla=(False, True), mla_dims=((12, 8), (24, 16)))
MLA = Capabilities(kv_dtypes=KV_DTYPES, mla=(True,), mla_dims=((12, 8), (24, 16)))
SMALL = Limits(max_batch=3, max_kv_len=20, max_qo_len=8, max_kv_heads=2, max_qo_heads=8, head_dims=(4, 8))


def _close(a: torch.Tensor, b: list | torch.Tensor) -> None:
    b = torch.as_tensor(b, dtype=torch.float64).view_as(a)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@settings(max_examples=50, deadline=None)
@given(case=cases(MASKED, SMALL))
def test_masked_cases_match_the_naive_per_token_loop(case: Case) -> None:
    tensors = make_tensors(case)
    ref = reference(case, tensors)
    out, lse = naive_attention(case, tensors)
    _close(ref.out, out)
    _close(ref.lse, lse)


@settings(max_examples=40, deadline=None)
@given(case=cases(MASKED.replace(logits_soft_cap=False, sinks=False), SMALL))
def test_masked_cases_match_sdpa_in_float64(case: Case) -> None:
    tensors = make_tensors(case)
    torch.testing.assert_close(reference(case, tensors).out, _sdpa_fp64(case, tensors), rtol=1e-9, atol=1e-11)


@settings(max_examples=30, deadline=None)
@given(case=cases(MASKED, SMALL), reorder_ops=st.booleans(), chunk=st.integers(1, 7))
def test_masked_control_in_float64_and_chunking_match_the_reference(case: Case, reorder_ops: bool, chunk: int) -> None:
    tensors = make_tensors(case)
    ref = reference(case, tensors)
    out, lse = plain_attention(case, tensors, torch.float64, reorder_ops=reorder_ops)
    torch.testing.assert_close(out, ref.out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, ref.lse, rtol=1e-10, atol=1e-12)
    chunked = reference(case, tensors, chunk_size=chunk)
    torch.testing.assert_close(chunked.out, ref.out, rtol=1e-10, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(case=cases(Capabilities(kv_dtypes=KV_DTYPES), SMALL), data=st.data())
def test_a_chain_tree_is_the_causal_mask(case: Case, data: st.DataObject) -> None:
    lay = case.layout
    prefixes = [data.draw(st.integers(0, 6), label=f"prefix[{b}]") for b in range(lay.batch_size)]
    chain = Layout.from_lengths(list(lay.qo_lens), [p + q for p, q in zip(prefixes, lay.qo_lens)], lay.page_size)
    causal = case.replace(layout=chain, options=dataclasses.replace(case.options, causal=True))
    tree = causal.replace(
        options=dataclasses.replace(causal.options, causal=data.draw(st.booleans(), label="causal too")),
        custom_mask=CustomMask(tree_parents=tuple(tuple(range(-1, q - 1)) for q in lay.qo_lens)),
    )
    tensors = make_tensors(causal)
    a, b = reference(causal, tensors), reference(tree, tensors)
    torch.testing.assert_close(b.out, a.out, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(b.lse, a.lse, rtol=1e-12, atol=1e-14)


@settings(max_examples=60, deadline=None)
@given(parents=tree_parents())
def test_drawn_trees_are_valid_and_their_masks_hold_the_ancestors(parents: tuple[int, ...]) -> None:
    n = len(parents)
    assert 1 <= n <= 16
    lay = Layout.from_lengths([n], [n + 3], 4)
    (mask,) = CustomMask(tree_parents=(parents,)).dense(lay)
    assert mask[:, :3].all()
    for i, p in enumerate(parents):
        ancestors = {i}
        while p >= 0:
            ancestors.add(p)
            p = parents[p]
        assert set(np.flatnonzero(mask[i, 3:])) == ancestors


def test_the_two_mask_forms_agree_and_round_trip_through_json() -> None:
    lay = Layout.from_lengths([3, 2], [5, 2], 2)
    tree = CustomMask(tree_parents=((-1, 0, 0), (-1, -1)))
    bits = CustomMask.from_dense(tree.dense(lay))
    for mask in (tree, bits):
        case = Case(lay, Heads(2, 1, 4, 4), custom_mask=mask)
        assert Case.from_json(case.to_json()) == case
        assert [m.tolist() for m in case.masks()] == [m.tolist() for m in tree.dense(lay)]
    packed, indptr = flashinfer_packed_mask(tree.dense(lay))
    assert indptr.tolist() == [0, 2, 3]  # 15 bits -> 2 bytes, 4 bits -> 1 byte
    assert np.unpackbits(packed[:2], bitorder="little")[:15].tolist() == tree.dense(lay)[0].reshape(-1).tolist()


def test_a_row_with_no_allowed_key_is_empty() -> None:
    lay = Layout.from_lengths([2], [3], 2)
    case = Case(lay, Heads(2, 1, 4, 4), Options(sinks=(1.0, -1.0)), custom_mask=CustomMask.from_dense([np.array([[0, 0, 0], [1, 0, 1]], bool)]))
    ref = reference(case, make_tensors(case))
    assert torch.equal(ref.out[0], torch.zeros_like(ref.out[0])) and torch.isneginf(ref.lse[0]).all()
    assert torch.isfinite(ref.lse[1]).all()


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        (CustomMask(tree_parents=((-1, 0),)), "has 2 nodes"),
        (CustomMask(tree_parents=((-1, 0, 1),)), "qo_len <= kv_len"),
        (CustomMask(bits="AAA="), "bytes"),
        (CustomMask(bits="/w=="), "padding bits"),
        (CustomMask(bits="!!"), "base64"),
    ],
)
def test_bad_masks_name_the_field(mask: CustomMask, message: str) -> None:
    lay = Layout.from_lengths([3], [2], 2) if "kv_len" in message else Layout.from_lengths([1], [3], 2)
    with pytest.raises(CaseError, match=message):
        Case(lay, Heads(1, 1, 4, 4), custom_mask=mask)


def test_a_parent_must_come_before_its_child() -> None:
    with pytest.raises(CaseError, match=r"tree_parents\[0\]\[1\]=1"):
        CustomMask(tree_parents=((-1, 1),))


def test_absent_family_fields_leave_the_json_and_the_case_id_as_before() -> None:
    case = Case(Layout.from_lengths([1], [3], 2), Heads(2, 1, 4, 4))
    body = case.to_json()
    assert "custom_mask" not in body and "mla" not in body["heads"]
    assert case.replace(heads=Heads(2, 1, 4, 3, mla=True)).case_id != case.replace(heads=Heads(2, 1, 4, 3)).case_id


@settings(max_examples=40, deadline=None)
@given(case=cases(MLA, SMALL))
def test_an_mla_case_is_the_mqa_case_with_v_sliced_out_of_k(case: Case) -> None:
    tensors = make_tensors(case)
    assert tensors.v_is_latent_view() and tensors.k_cache.shape[2] == 1
    dvo = case.heads.head_dim_vo
    mqa = case.replace(heads=dataclasses.replace(case.heads, mla=False))
    sliced = Tensors(tensors.q.clone(), tensors.k_cache.clone(), tensors.k_cache[..., :dvo].clone())
    a, b = reference(case, tensors), reference(mqa, sliced)
    assert torch.equal(a.out, b.out) and torch.equal(a.lse, b.lse)
    out, lse = naive_attention(case, tensors)
    _close(a.out, out)


def test_mla_heads_are_checked() -> None:
    with pytest.raises(CaseError, match="one KV head"):
        Heads(4, 2, 12, 8, mla=True)
    with pytest.raises(CaseError, match="head_dim_vo"):
        Heads(4, 1, 8, 8, mla=True)


def test_an_mla_sidecar_must_hold_v_as_the_latent_slice(tmp_path) -> None:  # type: ignore[no-untyped-def]
    case = Case(Layout.from_lengths([2], [5], 2), Heads(2, 1, 12, 8, mla=True), seed=4)
    tensors = make_tensors(case)
    path = save_tensors(tensors, tmp_path / "t.npz")
    assert load_tensors(case, path).v_is_latent_view()
    broken = Tensors(tensors.q, tensors.k_cache, tensors.k_cache[..., :8].clone() + 1)
    with pytest.raises(CaseError, match="first head_dim_vo dims of k_cache"):
        load_tensors(case, save_tensors(broken, tmp_path / "b.npz"))


def test_the_fused_engine_declines_masked_and_mla_cases() -> None:
    masked = Case(Layout.from_lengths([2], [5], 2), Heads(2, 1, 4, 4), custom_mask=CustomMask(tree_parents=((-1, 0),)))
    latent = Case(Layout.from_lengths([2], [5], 2), Heads(2, 1, 12, 8, mla=True))
    for case in (masked, latent):
        tensors = make_tensors(case)
        assert reference(case, tensors, engine="auto").engine == "torch"
        with pytest.raises(ValueError, match="declines"):
            reference(case, tensors, engine="fused")
