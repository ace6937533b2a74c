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
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from pa_oracle.fuzz.quality.planted import _paged_attention
from pa_oracle.oracle.case import STORAGE_FEATURES


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


def _planted(name: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` named ``name``, declaring every storage."""
    kernel.__name__ = kernel.__qualname__ = name
    kernel.pa_oracle_capabilities = {"storages": STORAGE_FEATURES}  # type: ignore[attr-defined]
    return kernel


def _standard(name: str, read: Callable[[torch.Tensor], torch.Tensor] | None):  # type: ignore[no-untyped-def]
    """A kernel of the standard signature that reads q and the caches through ``read`` (None: as given)."""

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap):
        if read is not None:
            q, k_cache, v_cache = read(q), read(k_cache), read(v_cache)
        return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                          kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=window_left,
                          logits_soft_cap=logits_soft_cap)

    return _planted(name, kernel)


def _layout_aware(name: str, *, confused: bool):  # type: ignore[no-untyped-def]
    """A kernel that takes its caches in the stored page layout (``kv_layout``) and the combined tensor."""

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap, kv_layout, paged_kv_cache):
        if paged_kv_cache is not None:  # the combined tensor: K and V are its halves
            k_cache, v_cache = paged_kv_cache.unbind(1)
        if kv_layout == "HND":
            convert = _nhd_offsets_on_hnd if confused else (lambda cache: cache.transpose(1, 2))
            k_cache, v_cache = convert(k_cache), convert(v_cache)
        return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                          kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=window_left,
                          logits_soft_cap=logits_soft_cap)

    return _planted(name, kernel)


reads_caches_as_contiguous = _standard("reads_caches_as_contiguous", as_if_contiguous)
ignores_storage_offset = _standard("ignores_storage_offset", _from_storage_start)
hnd_read_as_nhd = _layout_aware("hnd_read_as_nhd", confused=True)
correct_any_storage = _standard("correct_any_storage", None)
correct_layout_aware = _layout_aware("correct_layout_aware", confused=False)

BUGS = {
    "reads_caches_as_contiguous": "q and the caches read with contiguous strides from their data pointers (a stride bug: flashinfer#527's class)",
    "ignores_storage_offset": "q and the caches read from the start of their allocation (caches sliced from a larger pool)",
    "hnd_read_as_nhd": "HND pages addressed with NHD offsets: slot and head axes confused (vllm#49012, LMCache#4467)",
}
CORRECT = ("correct_any_storage", "correct_layout_aware")
PLANTED = tuple(BUGS)
