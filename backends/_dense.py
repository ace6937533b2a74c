"""Paged KV -> padded dense tensors and position masks, shared by the dense torch adapters.

These adapters read the pages themselves (the kernels they call are not paged), so this module
is their "kernel side" conversion, written independently of ``oracle.reference``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oracle.case import Case
from oracle.tensors import Tensors


@dataclass(frozen=True)
class Dense:
    q: torch.Tensor  # [B, Hq, max_q, Dqk]
    k: torch.Tensor  # [B, Hkv, max_kv, Dqk]
    v: torch.Tensor  # [B, Hkv, max_kv, Dvo]
    q_pos: torch.Tensor  # [B, max_q] absolute positions
    q_valid: torch.Tensor  # [B, max_q]
    kv_valid: torch.Tensor  # [B, max_kv]


def to_dense(case: Case, tensors: Tensors) -> Dense:
    """Gather each request's pages into padded dense tensors (padding is zero, never poison)."""
    lay, device = case.layout, tensors.q.device
    batch = lay.batch_size
    max_q, max_kv = max(max(lay.qo_lens), 1), max(max(lay.kv_lens), 1)
    hq, hkv = case.heads.num_qo_heads, case.heads.num_kv_heads
    q = tensors.q.new_zeros(batch, max_q, hq, case.heads.head_dim_qk)
    k = tensors.k_cache.new_zeros(batch, max_kv, hkv, case.heads.head_dim_qk)
    v = tensors.v_cache.new_zeros(batch, max_kv, hkv, case.heads.head_dim_vo)
    for b in range(batch):
        qo_len, kv_len = lay.qo_lens[b], lay.kv_lens[b]
        q[b, :qo_len] = tensors.q[lay.qo_indptr[b] : lay.qo_indptr[b + 1]]
        if kv_len:
            pages = torch.tensor(lay.pages_of(b), device=device)
            k[b, :kv_len] = tensors.k_cache[pages].flatten(0, 1)[:kv_len]
            v[b, :kv_len] = tensors.v_cache[pages].flatten(0, 1)[:kv_len]
    qo = torch.tensor(lay.qo_lens, device=device)
    kv = torch.tensor(lay.kv_lens, device=device)
    i = torch.arange(max_q, device=device)
    j = torch.arange(max_kv, device=device)
    return Dense(
        q=q.transpose(1, 2),
        k=k.transpose(1, 2),
        v=v.transpose(1, 2),
        q_pos=(kv - qo)[:, None] + i,
        q_valid=i[None, :] < qo[:, None],
        kv_valid=j[None, :] < kv[:, None],
    )


def keep_mask(case: Case, dense: Dense) -> torch.Tensor:
    """[B, max_q, max_kv] True where a query attends a key (bottom-right causal, window)."""
    opts = case.options
    k_pos = torch.arange(dense.kv_valid.shape[1], device=dense.q_pos.device)[None, None, :]
    q_pos = dense.q_pos[:, :, None]
    keep = dense.kv_valid[:, None, :] & dense.q_valid[:, :, None]
    if opts.causal:
        keep = keep & (k_pos <= q_pos)
    if opts.window_left >= 0:
        keep = keep & (k_pos >= q_pos - opts.window_left)
    return keep


def alibi_bias(case: Case, dense: Dense, dtype: torch.dtype) -> torch.Tensor:
    """[B, Hq, max_q, max_kv] ``-slope[h] * |q_pos - k_pos|``."""
    k_pos = torch.arange(dense.kv_valid.shape[1], device=dense.q_pos.device)
    distance = (dense.q_pos[:, None, :, None] - k_pos).abs().to(dtype)
    slopes = torch.tensor(case.options.alibi_slopes, dtype=dtype, device=distance.device)
    return -slopes[None, :, None, None] * distance


def from_dense(case: Case, out: torch.Tensor) -> torch.Tensor:
    """[B, Hq, max_q, Dvo] -> flat [total_q, Hq, Dvo] rows."""
    rows = [out[b, :, :n].transpose(0, 1) for b, n in enumerate(case.layout.qo_lens)]
    return torch.cat(rows) if rows else out.new_zeros(0, *out.shape[1:2], out.shape[-1])
