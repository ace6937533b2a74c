from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pa_oracle.backends.vllm_flashinfer import (
    DECODE,
    EXTEND,
    PREFILL,
    BatchSplit,
    VllmFlashInfer,
    reorder_requests,
    request_regions,
    split_batch,
    split_decodes_and_prefills,
    stitch_rows,
)
from pa_oracle.fuzz.draw.strategies import Limits, layouts
from pa_oracle.oracle.case import Layout

# (qo_len, computed tokens): vLLM's scheduled and already-cached token counts of a request
requests = st.lists(st.tuples(st.integers(1, 6), st.integers(0, 4)), min_size=1, max_size=12)
vllm_layouts = layouts(VllmFlashInfer.capabilities.replace(devices=("cpu",)), Limits(max_batch=8, max_kv_len=80))


def _lens(batch: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    return [q for q, _ in batch], [q + c for q, c in batch]


@settings(max_examples=300)
@given(batch=requests, threshold=st.integers(1, 3))
def test_reorder_moves_only_misplaced_requests_in_region_order(batch: list[tuple[int, int]], threshold: int) -> None:
    qo_lens, kv_lens = _lens(batch)
    regions = request_regions(qo_lens, kv_lens, threshold)
    order = reorder_requests(qo_lens, kv_lens, threshold)
    assert sorted(order) == list(range(len(batch)))
    # simple definition: target regions by position; a misplaced slot receives the misplaced
    # requests sorted by (region, original index)
    targets = sorted(regions)
    misplaced = [i for i in range(len(batch)) if regions[i] != targets[i]]
    expected = list(range(len(batch)))
    for slot, src in zip(misplaced, sorted(misplaced, key=lambda i: (regions[i], i))):
        expected[slot] = src
    assert list(order) == expected
    assert [regions[b] for b in order] == targets


def test_regions_follow_computed_tokens_not_only_query_counts() -> None:
    assert request_regions([1, 1, 5, 5], [1, 9, 5, 9]) == [PREFILL, DECODE, PREFILL, EXTEND]
    # a fresh one-token request is a "prefill": it goes behind the extends
    assert reorder_requests([1, 3, 1], [1, 10, 4]) == (2, 1, 0)


@settings(max_examples=300)
@given(qo_lens=st.lists(st.integers(1, 6), min_size=1, max_size=12))
def test_split_with_threshold_one_takes_the_leading_single_token_requests(qo_lens: list[int]) -> None:
    num_decodes, num_prefills, decode_tokens, prefill_tokens = split_decodes_and_prefills(qo_lens, 1, True)
    expected = len(list(itertools.takewhile(lambda q: q == 1, qo_lens)))
    if all(q == 1 for q in qo_lens):
        expected = len(qo_lens)
    assert (num_decodes, num_prefills) == (expected, len(qo_lens) - expected)
    assert (decode_tokens, prefill_tokens) == (expected, sum(qo_lens) - expected)


@settings(max_examples=300)
@given(qo_lens=st.lists(st.integers(1, 6), min_size=1, max_size=12), threshold=st.integers(1, 4))
def test_uniform_split_keeps_one_query_length_per_decode_chunk(qo_lens: list[int], threshold: int) -> None:
    num_decodes, num_prefills, decode_tokens, prefill_tokens = split_decodes_and_prefills(qo_lens, threshold, True)
    assert num_decodes + num_prefills == len(qo_lens)
    assert decode_tokens == sum(qo_lens[:num_decodes]) and prefill_tokens == sum(qo_lens[num_decodes:])
    assert len(set(qo_lens[:num_decodes])) <= 1
    assert all(q <= threshold for q in qo_lens[:num_decodes]) or num_decodes == len(qo_lens)


def _fake_kernel(split: BatchSplit, layout: Layout, q_ids: torch.Tensor) -> torch.Tensor:
    """Each query row reports what a paged kernel given the chunk's indices would see:
    [kv_len, qo_len, offset in its request, the query it read, its pages (padded -1)]."""
    width = 4 + max(layout.num_pages_per_request)
    out = torch.full((len(q_ids), width), -2, dtype=torch.long)
    for chunk in (split.decode, split.prefill):
        if chunk is None:
            continue
        for i in range(len(chunk.kv_last_page_len)):
            pages = split.kv_indices[chunk.kv_indptr[i] : chunk.kv_indptr[i + 1]]
            kv_len = (len(pages) - 1) * layout.page_size + chunk.kv_last_page_len[i] if pages else 0
            qo_len = chunk.qo_indptr[i + 1] - chunk.qo_indptr[i]
            for t in range(qo_len):
                row = chunk.rows.start + chunk.qo_indptr[i] + t
                padded = list(pages) + [-1] * (width - 4 - len(pages))
                out[row] = torch.tensor([kv_len, qo_len, t, int(q_ids[row])] + padded)
    return out


@settings(max_examples=200)
@given(layout=vllm_layouts)
def test_split_and_stitch_give_every_query_its_own_request(layout: Layout) -> None:
    split = split_batch(layout)
    row_order = torch.tensor(split.row_order)
    q_ids = torch.arange(layout.total_q)
    stitched = stitch_rows(_fake_kernel(split, layout, q_ids[row_order]), row_order)
    width = stitched.shape[1]
    for b in range(layout.batch_size):
        pages = list(layout.pages_of(b)) + [-1] * (width - 4 - len(layout.pages_of(b)))
        for t in range(layout.qo_lens[b]):
            row = layout.qo_indptr[b] + t
            expected = [layout.kv_lens[b], layout.qo_lens[b], t, row] + pages
            assert stitched[row].tolist() == expected, f"request {b} row {row}"


@settings(max_examples=200)
@given(layout=vllm_layouts)
def test_chunks_index_as_vllm_plans_them(layout: Layout) -> None:
    split = split_batch(layout)
    covered = []
    if split.decode is not None:
        assert split.decode.qo_indptr == tuple(range(len(split.decode.qo_indptr)))
        assert split.decode.kv_indptr[0] == 0
        covered += list(split.decode.rows)
    if split.prefill is not None:
        assert split.prefill.qo_indptr[0] == 0
        assert split.prefill.qo_indptr[-1] == len(split.prefill.rows)
        assert split.prefill.kv_indptr[-1] == len(split.kv_indices)
        if split.decode is not None:  # vLLM slices kv_indptr without re-basing it
            assert split.prefill.kv_indptr[0] == split.decode.kv_indptr[-1]
        covered += list(split.prefill.rows)
    assert covered == list(range(layout.total_q))
    assert sorted(split.kv_indices) == sorted(layout.kv_indices)


def test_stitch_inverts_the_row_gather() -> None:
    x = torch.arange(12.0).view(6, 2)
    row_order = torch.tensor([3, 0, 5, 1, 4, 2])
    assert torch.equal(stitch_rows(x[row_order], row_order), x)


@pytest.mark.parametrize(
    ("qo_lens", "kv_lens", "why"), [([0, 1], [3, 3], "qo_len=0"), ([4], [3], "qo_len=4, kv_len=3")]
)
def test_split_refuses_batches_vllm_never_schedules(qo_lens: list[int], kv_lens: list[int], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        split_batch(Layout.from_lengths(qo_lens, kv_lens, 4))
