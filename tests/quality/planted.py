"""Kernels with the user-kernel signature: one correct torch kernel and planted bugs that the
fuzzer must find (each a bug class from ANCHORS.md section 6).

``correct_attention`` computes in float32 and rounds its output to q's dtype: a correct kernel
rounded differently from the oracle, which must *not* be flagged.
"""

from __future__ import annotations

import torch


def _paged_attention(
    q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale, window_left,
    logits_soft_cap, bug: str = "",
):
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_qo_heads = q.shape[1]
    group = num_qo_heads // num_kv_heads
    out = torch.zeros(q.shape[0], num_qo_heads, v_cache.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[0], num_qo_heads), float("-inf"), device=q.device)
    if bug == "wrong_gqa_map":
        kv_head_of = torch.arange(num_qo_heads, device=q.device) % num_kv_heads
    else:
        kv_head_of = torch.arange(num_qo_heads, device=q.device) // group
    for b in range(len(qo_indptr) - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        pages = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        if len(pages) == 0 or q1 == q0:
            continue
        kv_len = (len(pages) - 1) * page_size + int(kv_last_page_len[b])
        if bug == "last_page_off_by_one":
            kv_len -= 1
            if kv_len == 0:
                continue
        k = k_cache[pages].flatten(0, 1)[:kv_len].float()[:, kv_head_of]  # [kv, Hq, D]
        v = v_cache[pages].flatten(0, 1)[:kv_len].float()[:, kv_head_of]
        qo_len = q1 - q0
        s = torch.einsum("qhd,khd->hqk", q[q0:q1].float(), k) * sm_scale
        if logits_soft_cap > 0:
            s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
        offset = 0 if bug == "top_left_causal" else kv_len - qo_len
        q_pos = torch.arange(qo_len, device=q.device)[:, None] + offset
        k_pos = torch.arange(kv_len, device=q.device)[None, :]
        keep = torch.ones(qo_len, kv_len, dtype=torch.bool, device=q.device)
        if causal:
            keep &= k_pos <= q_pos
        if window_left >= 0:
            keep &= k_pos >= q_pos - window_left
        s = s.masked_fill(~keep, float("-inf"))
        row_max = s.amax(-1, keepdim=True)  # [H, q, 1]
        empty = torch.isinf(row_max[..., 0])
        p = torch.exp(s - torch.where(torch.isinf(row_max), 0.0, row_max))
        denom = p.sum(-1)
        row_lse = torch.where(empty, float("-inf"), row_max[..., 0] + torch.log(denom))
        o = torch.einsum("hqk,khd->qhd", p / torch.where(empty, 1.0, denom)[..., None], v)
        out[q0:q1] = torch.where(empty.T[..., None], 0.0, o).to(q.dtype)
        lse[q0:q1] = row_lse.T
    return out, lse


def correct_attention(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal,
                      sm_scale, window_left, logits_soft_cap):
    return _paged_attention(**locals())


def wrong_gqa_map(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal,
                  sm_scale, window_left, logits_soft_cap):
    return _paged_attention(**locals(), bug="wrong_gqa_map")


def top_left_causal(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal,
                    sm_scale, window_left, logits_soft_cap):
    return _paged_attention(**locals(), bug="top_left_causal")


def last_page_off_by_one(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal,
                         sm_scale, window_left, logits_soft_cap):
    return _paged_attention(**locals(), bug="last_page_off_by_one")


PLANTED = ("wrong_gqa_map", "top_left_causal", "last_page_off_by_one")
