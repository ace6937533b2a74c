"""A user kernel of issue 43: float32 paged attention (``planted._paged_attention``'s plain path) that applies
ALiBi before the soft cap, where the convention (``cap-then-alibi``) is the other order; and the same kernel in
the right order."""

from __future__ import annotations

from typing import Any

import torch


def _attention(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap, alibi_slopes, alibi_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    page_size, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    out = torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype)
    lse = torch.full((q.shape[0], q.shape[1]), float("-inf"))
    for b in range(len(qo_indptr) - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        pages = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        kv_len = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + int(kv_last_page_len[b])
        if q1 == q0 or kv_len == 0:
            continue
        k = k_cache[pages].flatten(0, 1)[:kv_len].float().repeat_interleave(group, dim=1)
        v = v_cache[pages].flatten(0, 1)[:kv_len].float().repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[q0:q1].float(), k) * sm_scale
        q_pos = torch.arange(q1 - q0)[:, None] + kv_len - (q1 - q0)
        k_pos = torch.arange(kv_len)[None, :]
        bias = (q_pos - k_pos).abs().float() * (torch.zeros(q.shape[1]) if alibi_slopes is None else alibi_slopes.float())[:, None, None]
        if alibi_first:
            s = s - bias
        if logits_soft_cap > 0:
            s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
        if not alibi_first:
            s = s - bias
        keep = torch.ones_like(s[0], dtype=torch.bool)
        if causal:
            keep &= k_pos <= q_pos
        if window_left >= 0:
            keep &= k_pos >= q_pos - window_left
        s = s.masked_fill(~keep, float("-inf"))
        row_lse = torch.logsumexp(s, -1)
        p = torch.exp(s - row_lse[..., None]).nan_to_num(0.0)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", p, v).to(q.dtype)
        lse[q0:q1] = row_lse.T
    return out, lse


def alibi_then_cap(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
                   window_left, logits_soft_cap, alibi_slopes) -> Any:
    return _attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                      kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=window_left,
                      logits_soft_cap=logits_soft_cap, alibi_slopes=alibi_slopes, alibi_first=True)


def cap_then_alibi(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
                   window_left, logits_soft_cap, alibi_slopes) -> Any:
    return _attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                      kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=window_left,
                      logits_soft_cap=logits_soft_cap, alibi_slopes=alibi_slopes, alibi_first=False)
