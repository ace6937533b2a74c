"""Planted RoPE kernels for the selftest: a correct fused-RoPE kernel and one with the pairing swapped
(neox halves read as interleaved pairs and back). Each rotates q and the key cache itself, in
float64 through complex multiplication (written apart from ``pa_oracle.oracle.rope``), rounds them to
their dtypes as a kernel that rotates in place does, then attends with the planted float32 kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from pa_oracle.oracle.case import Rope

BUGS = {"rope_pairing_swapped": "RoPE pairs adjacent dims where halves are asked for, and halves where adjacent pairs are"}
_OTHER_STYLE = {"neox": "interleaved", "interleaved": "neox"}


def _rotate(x: torch.Tensor, positions: torch.Tensor, rope: Rope, style: str) -> torch.Tensor:
    """``x`` [N, H, D] rotated by ``positions`` [N] as ``style`` pairs its dims (float64)."""
    x = x.to(torch.float64)
    dims = x.shape[-1] if rope.rotary_dim is None else rope.rotary_dim
    if dims == 0:
        return x
    inv_freq = 1.0 / float(rope.theta) ** (torch.arange(0, dims, 2, dtype=torch.float64, device=x.device) / dims)
    turn = torch.polar(torch.ones_like(inv_freq), torch.outer(positions.to(torch.float64) / float(rope.scale), inv_freq))
    turn = turn[:, None, :]  # [N, 1, dims / 2]
    head, tail = x[..., :dims], x[..., dims:]
    if style == "interleaved":
        pairs = torch.view_as_complex(head.reshape(*head.shape[:-1], dims // 2, 2).contiguous()) * turn
        head = torch.view_as_real(pairs).flatten(-2)
    else:
        pairs = torch.complex(head[..., : dims // 2], head[..., dims // 2 :]) * turn
        head = torch.cat([pairs.real, pairs.imag], dim=-1)
    return torch.cat([head, tail], dim=-1)


def _rotated_inputs(
    q: torch.Tensor, k_cache: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor, rope: Rope, style: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and a copy of the key cache, each request's rows and slots rotated by absolute position."""
    page_size = k_cache.shape[1]
    q_out, k_out = q.clone(), k_cache.clone()
    for b in range(len(qo_indptr) - 1):
        pages = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        kv_len = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + int(kv_last_page_len[b])
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        q_pos = torch.arange(q0, q1, device=q.device) - q0 + kv_len - (q1 - q0)
        q_out[q0:q1] = _rotate(q[q0:q1], q_pos, rope, style).to(q.dtype)
        if kv_len:
            positions = torch.arange(kv_len, device=q.device)
            page_of, slot_of = pages[positions // page_size], positions % page_size
            k_out[page_of, slot_of] = _rotate(k_cache[page_of, slot_of], positions, rope, style).to(k_cache.dtype)
    return q_out, k_out


def planted_rope(bug: str, attention: Callable[..., Any]):  # type: ignore[no-untyped-def]
    """A user kernel taking ``rope``: rotates (``bug`` "" or a ``BUGS`` name), then ``attention``
    (``planted._paged_attention``, passed in: ``planted`` imports this module)."""

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap, rope: Rope | None = None) -> Any:
        if rope is not None:
            style = _OTHER_STYLE[rope.style] if bug == "rope_pairing_swapped" else rope.style
            q, k_cache = _rotated_inputs(q, k_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, rope, style)
        return attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                         kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                         window_left=window_left, logits_soft_cap=logits_soft_cap)

    kernel.__name__ = kernel.__qualname__ = bug or "correct_rope"
    kernel.pa_oracle_capabilities = {"rope": (True,)}  # type: ignore[attr-defined]  # every case rotates
    return kernel
