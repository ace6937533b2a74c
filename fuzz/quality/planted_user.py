"""Planted bugs that only what a user kernel is now given catches (issue 34): an fp8 q's ``q_scale`` and the
output dtype (``q_scale`` / ``out_dtype`` keywords), MLA dims outside the built-in pairs (``mla_dims`` keeps
every declared pair or refuses it by name), and strided views by default. Correct kernels beside them must
stay clean: one that takes ``q_scale``, one with an fp8 q that does not (its ``q_scale`` is folded into
``sm_scale``), one with MLA dims of its own and one that refuses views with an exception (its view cases
are unsupported: "refuses views"). The selftest runs them beside ``planted``'s (``BUGS`` / ``CORRECT``).

Each computes attention with ``planted._paged_attention`` (float32, through torch views).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from pa_oracle.fuzz.quality.planted import _paged_attention
from pa_oracle.fuzz.quality.planted_layouts import as_if_contiguous
from pa_oracle.oracle.case import FP8_DTYPES, Q_DTYPES

BUGS = {
    "q_scale_ignored": "an fp8 q's q_scale is accepted and ignored (the logits miss a factor q_scale)",
    "q_scale_from_k_scale": "an fp8 q is dequantised with k_scale instead of q_scale (one scale for q and K)",
    "mla_tail_dims_dropped": "MLA logits over whole 64-dim tiles only: exact for 576/512, drops q_pe of 288/256",
    "views_read_as_contiguous": "the caches read from their data pointers with contiguous strides, views not declared",
}
CORRECT = ("correct_fp8_q", "correct_fp8_q_folded", "correct_mla_own_dims", "correct_refuses_views")
PLANTED = tuple(BUGS)
OWN_MLA_DIMS = ((288, 256),)  # a latent pair outside the built-in ones (half DeepSeek's): drawn when declared, beside built-in ones too
MLA_TILE = 64  # the tile a DeepSeek-shaped kernel steps the head dim by
_FP8 = tuple(getattr(torch, name) for name in FP8_DTYPES)


def _named(name: str, kernel: Callable[..., Any], **declared: Any) -> Callable[..., Any]:
    kernel.__name__ = kernel.__qualname__ = name
    if declared:
        kernel.pa_oracle_capabilities = declared  # type: ignore[attr-defined]
    return kernel


def _fp8_q(name: str, *, bug: str = "") -> Callable[..., Any]:
    """A kernel naming ``q_scale`` and ``out_dtype`` (so fp8 q is drawn): q dequantised by ``q_scale`` (or by
    what ``bug`` reads instead), attention in float32, ``out`` in ``out_dtype``."""

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap, k_scale, v_scale, q_scale, out_dtype):
        scale = {"q_scale_ignored": 1.0, "q_scale_from_k_scale": k_scale}.get(bug, q_scale) if q.dtype in _FP8 else 1.0
        out, lse = _paged_attention(q.float() * scale, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                                    kv_indices=kv_indices, kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                                    window_left=window_left, logits_soft_cap=logits_soft_cap, k_scale=k_scale, v_scale=v_scale)
        return out.to(out_dtype), lse

    return _named(name, kernel)


def correct_fp8_q_folded(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
                         window_left, logits_soft_cap, k_scale, v_scale):
    """Declares fp8 q and names no ``q_scale``: the harness folds it into ``sm_scale``. An fp8 q's output
    dtype it cannot be told either, so it declares the one it returns (bfloat16)."""
    out, lse = _paged_attention(q.float(), k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                                kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=window_left,
                                logits_soft_cap=logits_soft_cap, k_scale=k_scale, v_scale=v_scale)
    return out.to(torch.bfloat16 if q.dtype in _FP8 else q.dtype), lse


correct_fp8_q_folded.pa_oracle_capabilities = {"q_dtypes": Q_DTYPES + FP8_DTYPES, "o_dtypes": ("bfloat16",)}  # type: ignore[attr-defined]


def _mla(name: str, *, tiled: bool) -> Callable[..., Any]:
    """An MLA kernel declaring ``OWN_MLA_DIMS``: logits ``q . k`` over the latent row ``[ckv | kpe]`` (``tiled``:
    over whole ``MLA_TILE``-dim tiles only, as a kernel written for 576/512 steps it), softmax, times ``ckv``."""

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap):
        if tiled:
            kept = q.shape[-1] // MLA_TILE * MLA_TILE
            q, k_cache = q[..., :kept], k_cache[..., :kept]
        return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                                kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=window_left,
                                logits_soft_cap=logits_soft_cap)

    return _named(name, kernel, mla=(True,), mla_dims=OWN_MLA_DIMS)


def views_read_as_contiguous(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
                             window_left, logits_soft_cap):
    """Declares nothing: reads each cache as ``ptr + ((page * page_size + slot) * H + h) * D`` (a C kernel
    given ``data_ptr()``), right for a contiguous cache only; silently wrong on a view."""
    k_cache, v_cache = as_if_contiguous(k_cache), as_if_contiguous(v_cache)
    return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                            kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=window_left,
                            logits_soft_cap=logits_soft_cap)


def correct_refuses_views(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
                          window_left, logits_soft_cap):
    """Correct on contiguous tensors, and says so for any other: a ValueError on a view (never wrong silently)."""
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {tensor.stride()} for shape {tuple(tensor.shape)}")
    return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                            kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=window_left,
                            logits_soft_cap=logits_soft_cap)


q_scale_ignored = _fp8_q("q_scale_ignored", bug="q_scale_ignored")
q_scale_from_k_scale = _fp8_q("q_scale_from_k_scale", bug="q_scale_from_k_scale")
correct_fp8_q = _fp8_q("correct_fp8_q")
mla_tail_dims_dropped = _mla("mla_tail_dims_dropped", tiled=True)
correct_mla_own_dims = _mla("correct_mla_own_dims", tiled=False)
