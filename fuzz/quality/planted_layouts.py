"""Planted memory-layout bugs (issue 15): user kernels that declare every ``Storage`` and address their
inputs wrongly, each of which the fuzzer must catch on CPU, and correct kernels given the same
storages that it must pass. The selftest runs them beside ``planted``'s (``BUGS`` / ``CORRECT`` here).

Each computes attention with ``planted._paged_attention`` (indexing through torch views) after
rebuilding its inputs the way the bug reads memory:

- ``reads_caches_as_contiguous``: q and the caches from their data pointers with the strides of a
  contiguous tensor of their shape (a kernel computing ``ptr + ((page * page_size + slot) * H + h) * D``):
  wrong for a combined K/V tensor, HND pages and a fused QKV q.
- ``ignores_storage_offset``: each tensor read from the start of its allocation (storage offset 0),
  with its own strides: wrong for caches inside a larger pool (an offset, V after K, a combined V half).
- ``hnd_read_as_nhd``: takes ``kv_layout`` and ignores it: HND pages addressed with NHD offsets within
  each page (the slot and head axes confused).

The strided pools (``STRIDE_STORAGES``), declared by these kernels only (every other kernel draws as before;
``STRIDED`` lists them for the selftest):

- ``dense_page_stride``: takes the caches in their stored layout (the combined ``[pages, 2, ...]`` tensor
  when there is one) and addresses page ``p`` at ``p * (the dense size of a page, from its row strides)``,
  every other stride its own: right for every dense storage (combined, HND, an offset, an interleaved
  head dim), wrong for padded pages and a layer of a cross-layer pool, whose page stride is larger
  (``stride(0)``, as FlashInfer's ``paged_kv_t`` reads it).
- ``ignores_dim_stride``: reads the head dim as contiguous (its stride taken as 1): wrong only where
  the head dim is interleaved (``dim_stride``).
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch
from pa_oracle.fuzz.quality.planted import _paged_attention
from pa_oracle.oracle.case import ALL_STORAGE_FEATURES, STORAGE_FEATURES


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def as_if_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t``'s storage read with contiguous strides from its offset: what a kernel given ``data_ptr()`` reads."""
    return torch.as_strided(t, t.shape, _contiguous_strides(t.shape), t.storage_offset())


def _from_storage_start(t: torch.Tensor) -> torch.Tensor:
    return torch.as_strided(t, t.shape, t.stride(), 0)


def _nhd_offsets_on_hnd(cache: torch.Tensor) -> torch.Tensor:
    """HND pages [P, H, page, D] read as NHD ([P, page, H, D], in-page offsets ``(slot * H + h) * D``)."""
    pages, heads, page_size, dim = cache.shape
    return torch.as_strided(cache, (pages, page_size, heads, dim), (cache.stride(0), heads * dim, dim, 1), cache.storage_offset())


def _dense_page_stride(cache: torch.Tensor) -> torch.Tensor:
    """``cache`` with page ``p`` read at ``p`` times the dense size of a page: its second axis's size times
    that axis's stride (``page_size * stride_n`` for NHD, ``heads * stride_h`` for HND, ``2 * (K's page)``
    for the combined tensor), as a kernel computing the page offset from the row strides does."""
    page = cache.shape[1] * cache.stride(1)
    return torch.as_strided(cache, cache.shape, (page, *cache.stride()[1:]), cache.storage_offset())


def _unit_dim_stride(cache: torch.Tensor) -> torch.Tensor:
    """``cache`` with its last (head) dim read as contiguous."""
    return torch.as_strided(cache, cache.shape, (*cache.stride()[:-1], 1), cache.storage_offset())


def _planted(name: str, kernel: Callable[..., Any], storages: tuple[str, ...] = STORAGE_FEATURES) -> Callable[..., Any]:
    """``kernel`` named ``name``, declaring ``storages`` (every dense storage by default)."""
    kernel.__name__ = kernel.__qualname__ = name
    kernel.pa_oracle_capabilities = {"storages": storages}  # type: ignore[attr-defined]
    return kernel


def _standard(name: str, read: Callable[[torch.Tensor], torch.Tensor] | None, *,  # type: ignore[no-untyped-def]
              storages: tuple[str, ...] = STORAGE_FEATURES, caches_only: bool = False):
    """A kernel of the standard signature that reads q (unless ``caches_only``) and the caches through ``read``
    (None: as given)."""

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap):
        if read is not None:
            q, k_cache, v_cache = q if caches_only else read(q), read(k_cache), read(v_cache)
        return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                          kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=window_left,
                          logits_soft_cap=logits_soft_cap)

    return _planted(name, kernel, storages)


def _layout_aware(name: str, *, confused: bool, storages: tuple[str, ...] = STORAGE_FEATURES,  # type: ignore[no-untyped-def]
                  read: Callable[[torch.Tensor], torch.Tensor] = lambda cache: cache):
    """A kernel that takes its caches in the stored page layout (``kv_layout``) and the combined tensor,
    each read through ``read`` as it is given."""

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap, kv_layout, paged_kv_cache):
        if paged_kv_cache is not None:  # the combined tensor: K and V are its halves
            k_cache, v_cache = read(paged_kv_cache).unbind(1)
        else:
            k_cache, v_cache = read(k_cache), read(v_cache)
        if kv_layout == "HND":
            convert = _nhd_offsets_on_hnd if confused else (lambda cache: cache.transpose(1, 2))
            k_cache, v_cache = convert(k_cache), convert(v_cache)
        return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                          kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=window_left,
                          logits_soft_cap=logits_soft_cap)

    return _planted(name, kernel, storages)


reads_caches_as_contiguous = _standard("reads_caches_as_contiguous", as_if_contiguous)
ignores_storage_offset = _standard("ignores_storage_offset", _from_storage_start)
hnd_read_as_nhd = _layout_aware("hnd_read_as_nhd", confused=True)
correct_any_storage = _standard("correct_any_storage", None)
correct_layout_aware = _layout_aware("correct_layout_aware", confused=False)
dense_page_stride = _layout_aware("dense_page_stride", confused=False, storages=ALL_STORAGE_FEATURES, read=_dense_page_stride)
ignores_dim_stride = _standard("ignores_dim_stride", _unit_dim_stride, storages=ALL_STORAGE_FEATURES, caches_only=True)
correct_strided_pool = _standard("correct_strided_pool", None, storages=ALL_STORAGE_FEATURES)
correct_strided_layout_aware = _layout_aware("correct_strided_layout_aware", confused=False, storages=ALL_STORAGE_FEATURES)

BUGS = {
    "reads_caches_as_contiguous": "q and the caches read with contiguous strides from their data pointers (a stride bug: flashinfer#527's class)",
    "ignores_storage_offset": "q and the caches read from the start of their allocation (caches sliced from a larger pool)",
    "hnd_read_as_nhd": "HND pages addressed with NHD offsets: slot and head axes confused (vllm#49012, LMCache#4467)",
}
CORRECT = ("correct_any_storage", "correct_layout_aware")
PLANTED = tuple(BUGS)

# the kernels that declare the strided pools, as a module of their own for the selftest (BUGS / PLANTED / CORRECT)
STRIDED_BUGS = {
    "dense_page_stride": "page addresses from the dense page size, not the tensor's page stride (padded pages, cross-layer pools)",
    "ignores_dim_stride": "the head dim read as contiguous where it is interleaved (its stride taken as 1)",
}
STRIDED_CORRECT = ("correct_strided_pool", "correct_strided_layout_aware")
STRIDED = types.SimpleNamespace(
    __name__=__name__, BUGS=tuple(STRIDED_BUGS), PLANTED=tuple(STRIDED_BUGS), CORRECT=STRIDED_CORRECT,
    **{name: globals()[name] for name in (*STRIDED_BUGS, *STRIDED_CORRECT)})
