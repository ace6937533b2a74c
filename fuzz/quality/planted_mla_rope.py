"""Planted MLA kernels with fused RoPE (DeepSeek's split, issue 34) for the selftest: q is ``[q_nope | q_pe]``
and the latent row ``[ckv | kpe]``; only ``q_pe`` and ``kpe`` rotate (``Rope.span``), by the absolute positions
the harness passes (``positions``, ``key_positions``). Each kernel rotates q and a copy of the latent cache
itself (``planted_rope._rotate``: float64 complex multiplication, written apart from ``pa_oracle.oracle.rope``),
rounds them to their dtypes as a kernel that rotates in place does, then attends with the planted float32
MLA kernel (V the unrotated first ``d_ckv`` dims).

``mla_rope_whole_row`` rotates the whole row, latent dims included (a normal head's RoPE applied to the MLA
layout); ``mla_rope_span_from_zero`` rotates the first ``d_kpe`` dims (a generic partial-rotary helper whose
``rotary_dim`` counts from dim 0), so ``q_nope`` / ``ckv`` turn and ``q_pe`` / ``kpe`` do not. Both are right
on every case without RoPE; only the MLA RoPE draw (``families.extend``) reaches them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from pa_oracle.fuzz.quality.planted import _paged_attention
from pa_oracle.fuzz.quality.planted_rope import _rotate
from pa_oracle.oracle.case import Rope

BUGS = {
    "mla_rope_whole_row": "MLA with fused RoPE rotates the whole q / latent row (q_nope and ckv too), not q_pe / kpe alone",
    "mla_rope_span_from_zero": "MLA with fused RoPE rotates the first d_kpe dims (q_nope / ckv) instead of the q_pe / kpe dims "
                               "after d_ckv (a partial-rotary helper counting from dim 0)",
}
CORRECT = ("correct_mla_rope",)
PLANTED = tuple(BUGS)
_CAPABILITIES = {"mla": (True,), "mla_dims": ((12, 8), (24, 16)), "rope": (True,)}  # small latent dims: a fast CPU selftest

Turn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _turn(bug: str, rope: Rope, d_ckv: int) -> Turn:
    """How the kernel rotates a row block ``x`` [N, H, D] by ``positions`` [N] (float64 out)."""
    if bug == "mla_rope_whole_row":
        return lambda x, p: _rotate(x, p, rope, rope.style)
    if bug == "mla_rope_span_from_zero":  # the rope part's width, but counted from dim 0

        def from_zero(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            dims = x.shape[-1] - d_ckv if rope.rotary_dim is None else rope.rotary_dim
            return _rotate(x, p, dataclasses.replace(rope, rotary_dim=dims), rope.style)

        return from_zero

    def split(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[..., :d_ckv].to(torch.float64), _rotate(x[..., d_ckv:], p, rope, rope.style)], dim=-1)

    return split


def _rotated(q: torch.Tensor, k_cache: torch.Tensor, layout: dict[str, torch.Tensor], positions: torch.Tensor,
             key_positions: torch.Tensor, turn: Turn) -> tuple[torch.Tensor, torch.Tensor]:
    """q and a copy of the latent cache, each referenced slot rotated at its key position (request-major)."""
    kv_indptr, kv_indices, last = layout["kv_indptr"], layout["kv_indices"], layout["kv_last_page_len"]
    page_size = k_cache.shape[1]
    q_out, k_out = turn(q, positions).to(q.dtype), k_cache.clone()
    start = 0
    for b in range(len(kv_indptr) - 1):
        pages = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        kv_len = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + int(last[b])
        if kv_len:
            slots = torch.arange(kv_len, device=q.device)
            page_of, slot_of = pages[slots // page_size], slots % page_size
            k_out[page_of, slot_of] = turn(k_cache[page_of, slot_of], key_positions[start : start + kv_len]).to(k_cache.dtype)
        start += kv_len
    return q_out, k_out


def _mla_rope_kernel(bug: str):  # type: ignore[no-untyped-def]
    """An MLA kernel with fused RoPE (``bug`` "" or a ``BUGS`` name)."""

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap, rope: Rope | None = None, positions: torch.Tensor | None = None,
               key_positions: torch.Tensor | None = None) -> Any:
        layout = {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr, "kv_indices": kv_indices, "kv_last_page_len": kv_last_page_len}
        if rope is not None:
            assert positions is not None and key_positions is not None, "the harness passes positions with rope"
            q, k_cache = _rotated(q, k_cache, layout, positions, key_positions, _turn(bug, rope, v_cache.shape[-1]))
        return _paged_attention(q, k_cache, v_cache, **layout, causal=causal, sm_scale=sm_scale, window_left=window_left,
                                logits_soft_cap=logits_soft_cap, mla=True)

    kernel.__name__ = kernel.__qualname__ = bug or "correct_mla_rope"
    kernel.pa_oracle_capabilities = dict(_CAPABILITIES)  # type: ignore[attr-defined]
    return kernel


mla_rope_whole_row = _mla_rope_kernel("mla_rope_whole_row")
mla_rope_span_from_zero = _mla_rope_kernel("mla_rope_span_from_zero")
correct_mla_rope = _mla_rope_kernel("")
