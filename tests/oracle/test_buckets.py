from __future__ import annotations

from unittest import mock

import numpy as np
import pa_oracle.oracle.buckets as buckets
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pa_oracle.backends.base import Capabilities
from pa_oracle.fuzz.draw.strategies import Limits, cases, layouts
from pa_oracle.oracle.case import KV_DTYPES, Case, Heads, Layout, Options
from pa_oracle.oracle.reference import plain_attention, reference
from pa_oracle.oracle.tensors import make_tensors, token_addresses, token_slots

ALL_OPTIONS = Capabilities(kv_dtypes=KV_DTYPES)
CPU = torch.device("cpu")
SMALL_HEADS = Limits(max_batch=5, max_kv_len=90, max_kv_heads=2, max_qo_heads=8, head_dims=(8, 16))


def _addresses_per_request(layout: Layout) -> list[tuple[int, int]]:
    addresses = []
    for b, kv_len in enumerate(layout.kv_lens):
        addresses += [layout.slot_of(b, position) for position in range(kv_len)]  # type: ignore[misc]
    return addresses


@settings(max_examples=80)
@given(layout=layouts(ALL_OPTIONS, Limits(max_batch=6, max_kv_len=70, max_extra_pages=5)))
def test_token_addresses_equal_a_per_request_loop(layout: Layout) -> None:
    case = Case(layout, Heads(1, 1, 4, 4))
    pages, slots = token_addresses(case)
    expected = _addresses_per_request(layout)
    assert pages.dtype == slots.dtype == torch.int64
    assert list(zip(pages.tolist(), slots.tolist())) == expected
    assert token_slots(case).tolist() == [page * layout.page_size + slot for page, slot in expected]


def test_token_addresses_of_empty_and_full_last_pages() -> None:
    layout = Layout.from_lengths([1, 0, 2, 1], [0, 4, 5, 0], page_size=4, page_order=[2, 0, 1])
    pages, slots = token_addresses(Case(layout, Heads(1, 1, 4, 4)))
    assert pages.tolist() == [2, 2, 2, 2, 0, 0, 0, 0, 1]
    assert slots.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    nothing = Case(Layout.from_lengths([1, 1], [0, 0], page_size=4), Heads(1, 1, 4, 4))
    assert [t.tolist() for t in token_addresses(nothing)] == [[], []]


def _never_tile() -> mock._patch:
    return mock.patch.dict(buckets._TILE_MIN_SAVING, {"cpu": float("inf")})


def _tile_every(rows: int) -> mock._patch:
    return mock.patch.dict(buckets._Q_TILE, {"cpu": rows})


@settings(max_examples=40, deadline=None)
@given(case=cases(ALL_OPTIONS.replace(causal=(True,)), Limits(max_batch=4, max_kv_len=90, max_qo_len=40, max_kv_heads=2, max_qo_heads=8, head_dims=(8, 16))), rows=st.integers(1, 9))
def test_tiling_changes_no_result_beyond_rounding(case: Case, rows: int) -> None:
    tensors = make_tensors(case)
    with _tile_every(rows):
        tiled = reference(case, tensors)
        tiled_control = plain_attention(case, tensors, torch.float64)
    with _never_tile():
        whole = reference(case, tensors)
        whole_control = plain_attention(case, tensors, torch.float64)
    for a, b in ((tiled.out, whole.out), (tiled.lse, whole.lse), *zip(tiled_control, whole_control)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(case=cases(ALL_OPTIONS, SMALL_HEADS), rows=st.sampled_from([None, 3]))
def test_the_plan_knows_on_the_host_whether_a_row_attends_no_key(case: Case, rows: int | None) -> None:
    # ``Plan.empty_rows`` lets the comparison skip its empty-row passes: it must be exactly
    # "some reference LSE is -inf" (tiled or not: a tile's rows are still the request's rows)
    with _tile_every(rows) if rows else _never_tile():
        plan = buckets.plan_buckets(case, torch.device("cpu"))
        ref = reference(case, make_tensors(case), plan=plan)
    assert plan.empty_rows == bool(torch.isneginf(ref.lse).any())


@settings(max_examples=25, deadline=None)
@given(case=cases(ALL_OPTIONS, SMALL_HEADS), chunk=st.sampled_from([None, 16]))
def test_bucketing_changes_no_result_beyond_rounding(case: Case, chunk: int | None) -> None:
    # free 0: equal lengths share a bucket, the rest are alone (their q and K/V read as views);
    # free 2**40: one padded, gathered bucket per query length. (logit_noise runs the same passes
    # but is not compared: half_ulp jumps at powers of two and at 0, so a logit one float64 ulp
    # off can move its bound by any factor.)
    tensors = make_tensors(case)
    results = []
    for free in (0, 1 << 40):
        with mock.patch.dict(buckets._PAD_FREE, {"cpu": free}):
            results.append(reference(case, tensors, chunk_size=chunk, logit_noise=True))
    (a, b) = results
    for x, y in ((a.out, b.out), (a.lse, b.lse)):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


@settings(max_examples=30)
@given(case=cases(ALL_OPTIONS, Limits(max_batch=6, max_kv_len=200)), data=st.data())
def test_bucket_shapes_do_not_depend_on_request_order(case: Case, data: st.DataObject) -> None:
    lay = case.layout
    perm = data.draw(st.permutations(range(lay.batch_size)), label="request order")
    moved = case.replace(layout=Layout.from_lengths([lay.qo_lens[b] for b in perm], [lay.kv_lens[b] for b in perm], lay.page_size))

    def shapes(c: Case) -> list[tuple]:
        plan = buckets.plan_buckets(c, CPU)
        return sorted((b.nb, b.max_q, b.max_kv, b.contiguous is None, b.first_key, b.masked) for b in plan.buckets)

    assert shapes(moved) == shapes(case)


def test_a_bucket_whose_rows_see_no_key_is_not_computed() -> None:
    # request 0 has no key, request 1's first two causal rows see none: only request 1 is planned
    case = Case(Layout.from_lengths([2, 4], [0, 2], page_size=4), Heads(2, 1, 8, 8), Options(causal=True))
    with mock.patch.dict(buckets._PAD_FREE, {"cpu": 0}):
        plan = buckets.plan_buckets(case, CPU)
    assert [(b.nb, b.max_q, b.max_kv, b.contiguous) for b in plan.buckets] == [(1, 4, 2, (2, 0))]
    assert plan.buckets[0].has_empty_rows(0, 2)


def test_a_call_without_queries_plans_nothing() -> None:
    case = Case(Layout.from_lengths([0, 0], [3, 0], page_size=2), Heads(2, 1, 4, 4), Options(causal=True))
    assert buckets.plan_buckets(case, CPU).buckets == []
    ref = reference(case, make_tensors(case))
    assert ref.out.shape == (0, 2, 4) and ref.lse.shape == (0, 2)


def test_empty_row_and_mask_side_decisions_follow_first_and_last() -> None:
    # window 1, causal: rows at positions 2..4 attend [pos - 1, pos]
    case = Case(Layout.from_lengths([3], [5], page_size=4), Heads(1, 1, 4, 4), Options(causal=True, window_left=1))
    (bucket,) = buckets.plan_buckets(case, CPU).buckets
    assert bucket.row_first.tolist() == [1, 2, 3] and bucket.row_last.tolist() == [2, 3, 4]
    assert bucket.first_key == 1
    assert not bucket.has_empty_rows(1, 5) and bucket.has_empty_rows(1, 2) and bucket.has_empty_rows(4, 5)
    assert bucket.mask_sides(1, 5) == (True, True)
    assert bucket.mask_sides(1, 2) == (True, False)  # column 1 is left of no row's last
    assert bucket.mask_sides(4, 5) == (False, True)  # column 4 is right of no row's first


@pytest.mark.parametrize(
    ("qo_len", "kv_len", "device", "cut"),
    [
        (512, 4096, "cuda", False),  # a serving prefill chunk: no tile skips anything but its diagonal
        (1024, 4096, "cuda", False),  # skips 1/16 of the logits
        (2048, 2048, "cuda", True),
        (1024, 2048, "cuda", True),  # skips 1/8
        (512, 4096, "cpu", True),
        (128, 128, "cpu", False),  # one tile
    ],
)
def test_tiling_rule(qo_len: int, kv_len: int, device: str, cut: bool) -> None:
    assert bool(buckets.tiled(np.array([qo_len]), np.array([kv_len]), device)[0]) is cut


def test_serving_prefill_chunks_are_not_cut_on_cuda() -> None:
    layout = Layout.from_lengths([512, 300, 1], [4096, 1200, 2000], page_size=16)
    pieces = buckets._pieces(Case(layout, Heads(32, 8, 128, 128), Options(causal=True)), "cuda")
    assert sorted(zip(pieces.qo.tolist(), pieces.kv.tolist())) == [(1, 2000), (300, 1200), (512, 4096)]


def test_padded_keys_count_against_the_budget_by_their_kv_width() -> None:
    layout = Layout.from_lengths([1] * 4, [100, 200, 300, 400], page_size=16)
    pieces = buckets._pieces(Case(layout, Heads(32, 8, 128, 128)), "cuda")
    # logits alone: 600 padded pairs x 32 heads fit a budget of 2**15; at 2048 per padded key they do not
    assert buckets._groups(pieces, 1 << 15, 32, 0.0)[1] == [(0, 4)]
    assert len(buckets._groups(pieces, 1 << 15, 32, 2048.0)[1]) == 4
