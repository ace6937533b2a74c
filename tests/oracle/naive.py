"""A deliberately naive paged attention: Python loops and ``math`` over one token at a time,
reading pages through ``kv_indices`` exactly as the case docstring says. Slow, small cases only.
"""

from __future__ import annotations

import math

from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import Tensors


def naive_attention(case: Case, tensors: Tensors) -> tuple[list, list]:
    lay, heads, opts = case.layout, case.heads, case.options
    q = tensors.q.double().tolist()
    k_cache = tensors.k_cache.double().tolist()
    v_cache = tensors.v_cache.double().tolist()
    group = heads.num_qo_heads // heads.num_kv_heads
    out = [[[0.0] * heads.head_dim_vo for _ in range(heads.num_qo_heads)] for _ in range(lay.total_q)]
    lse = [[float("-inf")] * heads.num_qo_heads for _ in range(lay.total_q)]
    masks = case.masks()
    for b in range(lay.batch_size):
        pages = lay.kv_indices[lay.kv_indptr[b] : lay.kv_indptr[b + 1]]
        kv_len = 0 if not pages else (len(pages) - 1) * lay.page_size + lay.kv_last_page_len[b]
        qo_len = lay.qo_indptr[b + 1] - lay.qo_indptr[b]
        for i in range(qo_len):
            row = lay.qo_indptr[b] + i
            p = kv_len - qo_len + i
            for h in range(heads.num_qo_heads):
                kvh = h // group
                logits, vals = [], []
                for j in range(kv_len):
                    if opts.causal and j > p:
                        continue
                    if opts.window_left >= 0 and j < p - opts.window_left:
                        continue
                    if masks is not None and not masks[b][i][j]:
                        continue
                    page, slot = pages[j // lay.page_size], j % lay.page_size
                    key = _rotated([x * opts.k_scale for x in k_cache[page][slot][kvh]], j, opts.rope)
                    s = case.sm_scale * sum(a * c for a, c in zip(_rotated(q[row][h], p, opts.rope), key))
                    alibi_first = opts.soft_cap_alibi_order == "alibi-then-cap"
                    if opts.alibi_slopes is not None and alibi_first:
                        s -= opts.alibi_slopes[h] * abs(p - j)
                    if opts.logits_soft_cap > 0:
                        s = opts.logits_soft_cap * math.tanh(s / opts.logits_soft_cap)
                    if opts.alibi_slopes is not None and not alibi_first:
                        s -= opts.alibi_slopes[h] * abs(p - j)
                    logits.append(s)
                    vals.append([x * opts.v_scale for x in v_cache[page][slot][kvh]])
                if not logits:
                    continue
                m = max(logits)
                weights = [math.exp(s - m) for s in logits]
                denom = sum(weights)
                lse[row][h] = m + math.log(denom)
                if opts.sinks is not None:
                    denom += math.exp(opts.sinks[h] - m)
                out[row][h] = [sum(w * v[d] for w, v in zip(weights, vals)) / denom for d in range(heads.head_dim_vo)]
    return out, lse


def _rotated(x: list, position: int, rope) -> list:  # noqa: ANN001
    """RoPE by the case docstring: pair i of the first rotary_dim dims turned by (p / scale) * theta ** (-2 i / rotary_dim)."""
    if rope is None:
        return x
    dims = len(x) if rope.rotary_dim is None else rope.rotary_dim
    out = list(x)
    for i in range(dims // 2):
        a, b = (i, i + dims // 2) if rope.style == "neox" else (2 * i, 2 * i + 1)
        angle = position / rope.scale * rope.theta ** (-2 * i / dims)
        out[a] = x[a] * math.cos(angle) - x[b] * math.sin(angle)
        out[b] = x[b] * math.cos(angle) + x[a] * math.sin(angle)
    return out
