"""Paged KV -> padded dense tensors and position masks, shared by the dense torch adapters.

These adapters read the pages themselves (the kernels they call are not paged), so this module
is their "kernel side" conversion, written independently of ``pa_oracle.oracle.reference``. It
indexes the caches by (page, slot) through their views, so any ``Storage`` (combined K/V, HND
pages, a pool offset, q inside a fused QKV buffer) is read where it lies, never copied whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import Tensors, upload


@dataclass(frozen=True)
class Dense:
    q: torch.Tensor  # [B, Hq, max_q, Dqk]
    k: torch.Tensor  # [B, Hkv, max_kv, Dqk]
    v: torch.Tensor  # [B, Hkv, max_kv, Dvo]
    q_pos: torch.Tensor  # [B, max_q] absolute positions
    q_valid: torch.Tensor  # [B, max_q]
    kv_valid: torch.Tensor  # [B, max_kv]


@dataclass(frozen=True)
class _Gather:
    """Where each real query row and key token of a layout sits in the dense tensors, on one device."""

    query_batch: torch.Tensor  # [total_q]
    query_column: torch.Tensor  # [total_q]
    key_batch: torch.Tensor  # [total_kv]
    key_column: torch.Tensor  # [total_kv]
    key_page: torch.Tensor  # [total_kv] physical page
    key_in_page: torch.Tensor  # [total_kv] slot within it
    qo_lens: torch.Tensor  # [B]
    kv_lens: torch.Tensor  # [B]


_last_gather: tuple[object, torch.device, _Gather] | None = None  # a model's layers share one layout per forward


def _gather(case: Case, device: torch.device) -> _Gather:
    """The layout's index tensors, built on the host with numpy and uploaded in one copy that does
    not wait (one upload per request would sync the stream per request: slow in a model's forward)."""
    global _last_gather
    lay = case.layout
    if _last_gather is not None and _last_gather[0] is lay and _last_gather[1] == device:
        return _last_gather[2]
    qo_lens, kv_lens = np.asarray(lay.qo_lens, dtype=np.int64), np.asarray(lay.kv_lens, dtype=np.int64)
    batch = np.arange(lay.batch_size, dtype=np.int64)
    query_batch, key_batch = np.repeat(batch, qo_lens), np.repeat(batch, kv_lens)
    query_column = np.arange(len(query_batch), dtype=np.int64) - np.repeat(np.cumsum(qo_lens) - qo_lens, qo_lens)
    key_column = np.arange(len(key_batch), dtype=np.int64) - np.repeat(np.cumsum(kv_lens) - kv_lens, kv_lens)
    page_entry = np.asarray(lay.kv_indptr[:-1], dtype=np.int64)[key_batch] + key_column // lay.page_size
    key_page = np.asarray(lay.kv_indices, dtype=np.int64)[page_entry]
    host = [query_batch, query_column, key_batch, key_column, key_page, key_column % lay.page_size, qo_lens, kv_lens]
    flat = upload(torch.from_numpy(np.concatenate(host)), device)
    gather = _Gather(*flat.split([len(x) for x in host]))
    _last_gather = (lay, device, gather)
    return gather


def to_dense(case: Case, tensors: Tensors) -> Dense:
    """Gather each request's pages into padded dense tensors (padding is zero, never poison)."""
    lay, device = case.layout, tensors.q.device
    batch = lay.batch_size
    max_q, max_kv = max(max(lay.qo_lens), 1), max(max(lay.kv_lens), 1)
    hq, hkv = case.heads.num_qo_heads, case.heads.num_kv_heads
    g = _gather(case, device)
    q = tensors.q.new_zeros(batch, max_q, hq, case.heads.head_dim_qk)
    k = tensors.k_cache.new_zeros(batch, max_kv, hkv, case.heads.head_dim_qk)
    v = tensors.v_cache.new_zeros(batch, max_kv, hkv, case.heads.head_dim_vo)
    q[g.query_batch, g.query_column] = tensors.q[: lay.total_q]
    k[g.key_batch, g.key_column] = tensors.k_cache[g.key_page, g.key_in_page]
    v[g.key_batch, g.key_column] = tensors.v_cache[g.key_page, g.key_in_page]
    qo, kv = g.qo_lens, g.kv_lens
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
    g = _gather(case, out.device)
    return out.transpose(1, 2)[g.query_batch, g.query_column]
