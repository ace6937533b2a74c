"""Planted kernels that keep state between calls, for the attention families (issue 14): a
mask that outlives its call (FlashInfer PR #1028), and a correct kernel that keeps masks the
way a planned wrapper does. The selftest runs them with the check named in ``CHECKS`` (a single
call cannot show state: ``mask-replan`` runs a layout with one mask, another, and again).

Both take the user-kernel signature with FlashInfer's packed mask (``custom_mask``,
``mask_indptr``; None for a case without one) and compute with ``planted._paged_attention``.
"""

from __future__ import annotations

import torch
from pa_oracle.fuzz.quality.planted import _paged_attention

BUGS = {
    "stale_mask_on_replan": "a call without a custom mask reuses the last mask given for the same shapes (flashinfer PR #1028)",
}
CORRECT = ("correct_replanned_mask",)
PLANTED = tuple(BUGS)
CHECKS = {"stale_mask_on_replan": "mask-replan", "correct_replanned_mask": "mask-replan"}  # else the oracle

_LayoutKey = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
_last_mask: dict[_LayoutKey, tuple[torch.Tensor, torch.Tensor]] = {}  # the buggy kernel's "plan"
_planned_mask: dict[_LayoutKey, tuple[torch.Tensor, torch.Tensor]] = {}  # the correct kernel's


def _shape_key(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor) -> _LayoutKey:
    """What a plan is made for: the query and key lengths (not which pages hold the keys)."""
    return tuple(qo_indptr.tolist()), tuple(kv_indptr.tolist()), tuple(kv_last_page_len.tolist())


def stale_mask_on_replan(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
                         window_left, logits_soft_cap, custom_mask, mask_indptr):
    key = _shape_key(qo_indptr, kv_indptr, kv_last_page_len)
    if custom_mask is not None:
        _last_mask[key] = (custom_mask.clone(), mask_indptr.clone())
    elif key in _last_mask:  # the bug: a plan without a mask does not clear the last one
        custom_mask, mask_indptr = _last_mask[key]
    return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                            kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=window_left,
                            logits_soft_cap=logits_soft_cap, custom_mask=custom_mask, mask_indptr=mask_indptr)


def correct_replanned_mask(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
                           window_left, logits_soft_cap, custom_mask, mask_indptr):
    """Keeps the last mask per shape (reused when the same bits come again), and drops it when a
    call comes without one: the fix of PR #1028."""
    key = _shape_key(qo_indptr, kv_indptr, kv_last_page_len)
    if custom_mask is None:
        _planned_mask.pop(key, None)
    else:
        kept = _planned_mask.get(key)
        same = kept is not None and torch.equal(kept[0], custom_mask) and torch.equal(kept[1], mask_indptr)
        if not same:
            _planned_mask[key] = (custom_mask.clone(), mask_indptr.clone())
        custom_mask, mask_indptr = _planned_mask[key]
    return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                            kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=window_left,
                            logits_soft_cap=logits_soft_cap, custom_mask=custom_mask, mask_indptr=mask_indptr)
