from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from pa_oracle.backends.base import Capabilities
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.oracle.case import KV_DTYPES, Case, Heads, Layout, Options
from pa_oracle.oracle.reference import LOG2_E, merge_states, plain_attention, reference
from pa_oracle.oracle.tensors import Tensors, make_tensors, token_addresses

from tests.oracle.naive import naive_attention

ALL_OPTIONS = Capabilities(kv_dtypes=KV_DTYPES)
SMALL = Limits(max_batch=3, max_kv_len=20, max_qo_len=8, max_kv_heads=2, max_qo_heads=8, head_dims=(4, 8))


@settings(max_examples=60)
@given(case=cases(ALL_OPTIONS, SMALL))
def test_matches_naive_per_token_loop(case: Case) -> None:
    tensors = make_tensors(case)
    ref = reference(case, tensors)
    out, lse = naive_attention(case, tensors)
    torch.testing.assert_close(ref.out, torch.tensor(out, dtype=torch.float64).view_as(ref.out), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ref.lse, torch.tensor(lse, dtype=torch.float64).view_as(ref.lse), rtol=1e-10, atol=1e-12)


@settings(max_examples=40)
@given(case=cases(ALL_OPTIONS, SMALL), reorder_ops=st.booleans())
def test_control_in_float64_matches_the_reference(case: Case, reorder_ops: bool) -> None:
    """The plain control, run in float64, is the reference up to rounding: a control with a wrong
    mask (or any other semantic slip) would set a wrong error scale and let broken kernels pass."""
    tensors = make_tensors(case)
    ref = reference(case, tensors)
    out, lse = plain_attention(case, tensors, torch.float64, reorder_ops=reorder_ops)
    torch.testing.assert_close(out, ref.out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, ref.lse, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window_left", [0, 1, 3, 7])
def test_control_and_reference_agree_on_windows_over_pages(causal: bool, window_left: int) -> None:
    """A mixed batch whose windows start inside earlier pages (seen wrong in the control once)."""
    layout = Layout.from_lengths([2, 1, 3], [9, 8, 13], page_size=4)
    case = Case(layout, Heads(4, 2, 16, 16), Options(causal=causal, window_left=window_left), seed=1)
    tensors = make_tensors(case)
    ref = reference(case, tensors)
    out, lse = naive_attention(case, tensors)
    torch.testing.assert_close(ref.out, torch.tensor(out, dtype=torch.float64).view_as(ref.out), rtol=1e-10, atol=1e-12)
    control_out, control_lse = plain_attention(case, tensors, torch.float64)
    torch.testing.assert_close(control_out, ref.out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(control_lse, ref.lse, rtol=1e-10, atol=1e-12)


def _sdpa_fp64(case: Case, tensors: Tensors) -> torch.Tensor:
    """Dense per-request SDPA in float64 with an explicit bottom-right mask."""
    lay, opts = case.layout, case.options
    pages, slots = token_addresses(case)
    keys = tensors.k_cache[pages, slots].double() * opts.k_scale
    values = tensors.v_cache[pages, slots].double() * opts.v_scale
    rows, start = [], 0
    masks = case.masks()
    for b in range(lay.batch_size):
        qo, kv = lay.qo_lens[b], lay.kv_lens[b]
        q = tensors.q[lay.qo_indptr[b] : lay.qo_indptr[b + 1]].double().transpose(0, 1)
        k = keys[start : start + kv].transpose(0, 1).repeat_interleave(case.heads.group_size, 0)
        v = values[start : start + kv].transpose(0, 1).repeat_interleave(case.heads.group_size, 0)
        start += kv
        q_pos = torch.arange(qo)[:, None] + kv - qo
        k_pos = torch.arange(kv)[None, :]
        keep = torch.ones(qo, kv, dtype=torch.bool)
        if opts.causal:
            keep &= k_pos <= q_pos
        if opts.window_left >= 0:
            keep &= k_pos >= q_pos - opts.window_left
        if masks is not None:
            keep &= torch.from_numpy(masks[b])
        bias = torch.zeros(case.heads.num_qo_heads, qo, kv, dtype=torch.float64)
        if opts.alibi_slopes:
            bias -= torch.tensor(opts.alibi_slopes, dtype=torch.float64)[:, None, None] * (q_pos - k_pos).abs()
        mask = torch.where(keep, bias, float("-inf"))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=case.sm_scale) if kv else torch.zeros(
            case.heads.num_qo_heads, qo, case.heads.head_dim_vo, dtype=torch.float64
        )
        rows.append(torch.nan_to_num(o).transpose(0, 1) * keep.any(-1)[:, None, None])
    return torch.cat(rows)


@settings(max_examples=60)
@given(case=cases(ALL_OPTIONS.replace(logits_soft_cap=False, sinks=False), Limits(max_batch=4, max_kv_len=80)))
def test_matches_sdpa_float64_on_dense_equivalent(case: Case) -> None:
    tensors = make_tensors(case)
    torch.testing.assert_close(reference(case, tensors).out, _sdpa_fp64(case, tensors), rtol=1e-9, atol=1e-11)


@settings(max_examples=30)
@given(case=cases(ALL_OPTIONS, Limits(max_batch=4, max_kv_len=120)), chunk=st.integers(1, 17))
def test_kv_chunking_does_not_change_the_result(case: Case, chunk: int) -> None:
    tensors = make_tensors(case)
    whole, chunked = reference(case, tensors), reference(case, tensors, chunk_size=chunk)
    torch.testing.assert_close(chunked.out, whole.out, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(chunked.lse, whole.lse, rtol=1e-12, atol=1e-13)


@settings(max_examples=30)
@given(case=cases(ALL_OPTIONS, Limits(max_batch=4, max_kv_len=60)), data=st.data())
def test_page_relabeling_changes_nothing(case: Case, data: st.DataObject) -> None:
    lay = case.layout
    order = data.draw(st.permutations(range(lay.num_pages)), label="new page order")
    relabeled = case.replace(layout=Layout.from_lengths(
        list(lay.qo_lens), list(lay.kv_lens), lay.page_size, page_order=order,
        extra_pages=lay.num_pages - len(lay.kv_indices),
    ))
    a, b = reference(case, make_tensors(case)), reference(relabeled, make_tensors(relabeled))
    assert torch.equal(a.out, b.out) and torch.equal(a.lse, b.lse)


def _explicit(case: Case, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> Tensors:
    """Tensors of ``case`` holding the given logical tokens (request-major order)."""
    lay, heads = case.layout, case.heads
    pages, slots = token_addresses(case)
    k_cache = torch.full((lay.num_pages, lay.page_size, heads.num_kv_heads, heads.head_dim_qk), float("nan"), dtype=keys.dtype)
    v_cache = torch.full((lay.num_pages, lay.page_size, heads.num_kv_heads, heads.head_dim_vo), float("nan"), dtype=values.dtype)
    k_cache[pages, slots], v_cache[pages, slots] = keys, values
    return Tensors(q, k_cache, v_cache)


def _logical(case: Case, tensors: Tensors) -> tuple[torch.Tensor, torch.Tensor]:
    pages, slots = token_addresses(case)
    return tensors.k_cache[pages, slots], tensors.v_cache[pages, slots]


@settings(max_examples=30)
@given(case=cases(ALL_OPTIONS, Limits(max_batch=5, max_kv_len=60)), data=st.data())
def test_request_reordering_permutes_rows(case: Case, data: st.DataObject) -> None:
    lay = case.layout
    perm = data.draw(st.permutations(range(lay.batch_size)), label="request order")
    tensors = make_tensors(case)
    keys, values = _logical(case, tensors)
    kv_start = [sum(lay.kv_lens[:b]) for b in range(lay.batch_size)]
    new = case.replace(layout=Layout.from_lengths([lay.qo_lens[b] for b in perm], [lay.kv_lens[b] for b in perm], lay.page_size))
    rows = torch.cat([torch.arange(lay.qo_indptr[b], lay.qo_indptr[b + 1]) for b in perm]).long()
    tokens = torch.cat([torch.arange(kv_start[b], kv_start[b] + lay.kv_lens[b]) for b in perm]).long()
    moved = reference(new, _explicit(new, tensors.q[rows], keys[tokens], values[tokens]))
    whole = reference(case, tensors)
    assert torch.equal(moved.out, whole.out[rows]) and torch.equal(moved.lse, whole.lse[rows])


@settings(max_examples=30)
@given(case=cases(ALL_OPTIONS, Limits(max_batch=3, max_kv_len=60)))
def test_gqa_equals_mha_with_repeated_kv_heads(case: Case) -> None:
    group = case.heads.group_size
    tensors = make_tensors(case)
    mha = case.replace(heads=dataclasses.replace(case.heads, num_kv_heads=case.heads.num_qo_heads))
    repeated = Tensors(tensors.q, *(c.repeat_interleave(group, dim=2) for c in (tensors.k_cache, tensors.v_cache)))
    a, b = reference(case, tensors), reference(mha, repeated)
    torch.testing.assert_close(a.out, b.out, rtol=1e-13, atol=1e-14)


@settings(max_examples=30)
@given(case=cases(ALL_OPTIONS.replace(causal=(False,), window_left=False, alibi=False, sinks=False), Limits(max_batch=4, max_kv_len=60)), data=st.data())
def test_split_kv_merged_equals_whole(case: Case, data: st.DataObject) -> None:
    lay = case.layout
    cuts = [data.draw(st.integers(0, n), label=f"split[{b}]") for b, n in enumerate(lay.kv_lens)]
    tensors = make_tensors(case)
    keys, values = _logical(case, tensors)
    parts = []
    for first in (True, False):
        lens = [c if first else n - c for c, n in zip(cuts, lay.kv_lens)]
        part = case.replace(layout=Layout.from_lengths(list(lay.qo_lens), lens, lay.page_size))
        tokens = torch.cat([
            torch.arange(sum(lay.kv_lens[:b]), sum(lay.kv_lens[:b]) + cuts[b]) if first
            else torch.arange(sum(lay.kv_lens[:b]) + cuts[b], sum(lay.kv_lens[: b + 1]))
            for b in range(lay.batch_size)
        ]).long()
        parts.append(reference(part, _explicit(part, tensors.q, keys[tokens], values[tokens])))
    out, lse = merge_states(parts[0].out, parts[0].lse, parts[1].out, parts[1].lse)
    whole = reference(case, tensors)
    assert not out.isnan().any()
    torch.testing.assert_close(out, whole.out, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(lse, whole.lse, rtol=1e-12, atol=1e-13)


def test_empty_rows_give_exact_zero_and_minus_inf() -> None:
    # request 0: no pages; request 1: causal with qo_len 4 > kv_len 2 leaves two rows with no key
    case = Case(Layout.from_lengths([2, 4], [0, 2], page_size=4), Heads(2, 1, 8, 8), Options(causal=True))
    ref = reference(case, make_tensors(case))
    empty = torch.tensor([True, True, True, True, False, False])
    assert torch.equal(ref.out[empty], torch.zeros_like(ref.out[empty]))
    assert torch.isneginf(ref.lse[empty]).all() and torch.isfinite(ref.lse[~empty]).all()


def test_lse_base_two() -> None:
    case = Case(Layout.from_lengths([3], [9], page_size=4), Heads(2, 2, 8, 8))
    tensors = make_tensors(case)
    torch.testing.assert_close(reference(case, tensors, lse_base="2").lse, reference(case, tensors).lse * LOG2_E)
    with pytest.raises(ValueError, match="lse_base"):
        reference(case, tensors, lse_base="10")


def test_merge_of_two_empty_states_is_empty_not_nan() -> None:
    out = torch.randn(3, 2, 4, dtype=torch.float64)
    inf = torch.full((3, 2), float("-inf"), dtype=torch.float64)
    merged, lse = merge_states(out * 0, inf, out * 0, inf)
    assert torch.equal(merged, torch.zeros_like(merged)) and torch.isneginf(lse).all()


def test_sink_adds_to_the_denominator_only() -> None:
    base = Case(Layout.from_lengths([1], [5], page_size=2), Heads(1, 1, 8, 8))
    sunk = base.replace(options=Options(sinks=(math.log(5.0),)))
    tensors = make_tensors(base)
    a, b = reference(base, tensors), reference(sunk, tensors)
    # exp(sink) equals the keys' total mass when lse == log 5; in general out scales by Z / (Z + e^sink)
    scale = torch.exp(a.lse) / (torch.exp(a.lse) + 5.0)
    torch.testing.assert_close(b.out, a.out * scale[..., None])
    torch.testing.assert_close(b.lse, a.lse)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@settings(max_examples=20)
@given(case=cases(ALL_OPTIONS, Limits(max_batch=4, max_kv_len=200)))
def test_cuda_reference_matches_cpu(case: Case) -> None:
    tensors = make_tensors(case)
    cpu, gpu = reference(case, tensors), reference(case, tensors.to("cuda"))
    torch.testing.assert_close(gpu.out.cpu(), cpu.out, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(gpu.lse.cpu(), cpu.lse, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(("cap", "alibi"), [(0.0, True), (5.0, False), (5.0, True)])
def test_soft_cap_alibi_orders_differ_only_when_both_are_on(cap: float, alibi: bool) -> None:
    layout = Layout.from_lengths([2, 1], [7, 5], page_size=4)
    heads = Heads(2, 1, 8, 8)
    slopes = (0.5, 0.25) if alibi else None
    first = Case(layout, heads, Options(logits_soft_cap=cap, alibi_slopes=slopes, sm_scale=2.0), seed=3)
    second = first.replace(options=dataclasses.replace(first.options, soft_cap_alibi_order="alibi-then-cap"))
    a, b = reference(first, make_tensors(first)), reference(second, make_tensors(second))
    naive_out, naive_lse = naive_attention(second, make_tensors(second))
    torch.testing.assert_close(b.lse, torch.tensor(naive_lse, dtype=torch.float64).view_as(b.lse), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(b.out, torch.tensor(naive_out, dtype=torch.float64).view_as(b.out), rtol=1e-10, atol=1e-12)
    if cap and alibi:
        assert (a.lse - b.lse).abs().max() > 1e-3 and (a.out - b.out).abs().max() > 1e-3
    else:
        assert torch.equal(a.lse, b.lse) and torch.equal(a.out, b.out)


def test_the_default_order_is_left_out_of_the_case_file() -> None:
    case = Case(Layout.from_lengths([1], [3], page_size=2), Heads(1, 1, 8, 8), Options(logits_soft_cap=5.0, alibi_slopes=(0.5,)))
    other = case.replace(options=dataclasses.replace(case.options, soft_cap_alibi_order="alibi-then-cap"))
    assert "soft_cap_alibi_order" not in case.to_json()["options"]
    assert other.to_json()["options"]["soft_cap_alibi_order"] == "alibi-then-cap"
    assert other.case_id != case.case_id and Case.from_json(other.to_json()) == other
    with pytest.raises(Exception, match="soft_cap_alibi_order must be one of"):
        Options(soft_cap_alibi_order="cap-first")
