"""The float64 Triton kernel behind ``oracle.fused``: one program attends one tile of packed
(query, head-in-group) rows of one request against that request's paged keys, for one kv head.

Imported only where Triton is installed. Under ``TRITON_INTERPRET=1`` the kernel runs in Triton's
interpreter (CPU tensors, float64 numpy exp/log instead of libdevice).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.runtime.interpreter import InterpretedFunction

# per tile, int64: first query row, qo_len, kv_len, first page-table entry, first packed row
TILE_FIELDS: tl.constexpr = tl.constexpr(5)
# float64: q scale (sm_scale * k_scale), v_scale, soft cap, LSE scale; then the slopes and sinks per head
PARAMS: tl.constexpr = tl.constexpr(4)


@triton.jit
def _to_float64(x, COMPILED: tl.constexpr):
    """``x`` (any float dtype) as float64, exactly. Compiled, the float32 step passes through an
    opaque identity: Triton sizes a dot operand's register layout by the narrowest load it can trace
    the operand back to, and its float64 MMA cannot take the layout of a 16- or 8-bit load."""
    x = x.to(tl.float32)
    if COMPILED:
        x = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=False, pack=1)
    return x.to(tl.float64)


def _attention(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, tiles_ptr, pages_ptr, params_ptr,
    stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    stride_ot, stride_oh, stride_lt,
    num_kv_heads, num_qo_heads, page_size, window_left,
    GROUP: tl.constexpr, HEAD_DIM_QK: tl.constexpr, HEAD_DIM_VO: tl.constexpr,
    BLOCK_DQK: tl.constexpr, BLOCK_DVO: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_CAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_SINKS: tl.constexpr, COMPILED: tl.constexpr,
):  # fmt: skip
    # COMPILED (not the interpreter) selects true float64 libdevice exp/log/tanh (tl.exp on float64
    # is only float32-accurate when compiled); the interpreter's tl.exp is numpy's float64 exp.
    pid = tl.program_id(0)
    tile = pid // num_kv_heads
    kv_head = pid % num_kv_heads
    info = tiles_ptr + tile.to(tl.int64) * TILE_FIELDS
    q_start = tl.load(info)  # int64: row offsets may exceed 2**31 elements
    qo_len = tl.load(info + 1).to(tl.int32)
    kv_len = tl.load(info + 2).to(tl.int32)
    page_start = tl.load(info + 3)
    m_start = tl.load(info + 4).to(tl.int32)

    rows = m_start + tl.arange(0, BLOCK_M)
    query = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_valid = query < qo_len
    pos = kv_len - qo_len + query  # bottom-right alignment; negative when qo_len > kv_len
    d_qk = tl.arange(0, BLOCK_DQK)
    d_vo = tl.arange(0, BLOCK_DVO)

    q_scale = tl.load(params_ptr)
    q_offsets = (q_start + query.to(tl.int64))[:, None] * stride_qt + head.to(tl.int64)[:, None] * stride_qh
    q = tl.load(q_ptr + q_offsets + d_qk[None, :], mask=row_valid[:, None] & (d_qk < HEAD_DIM_QK)[None, :], other=0.0)
    q = _to_float64(q, COMPILED) * q_scale
    if HAS_CAP:
        cap = tl.load(params_ptr + 2)
    if HAS_ALIBI:
        slope = tl.load(params_ptr + PARAMS + head, mask=row_valid, other=0.0)

    # Key blocks outside every row's range are skipped. Blocks stay aligned to multiples of BLOCK_N
    # whatever the tile, so a row sees the same blocks in the same order in any tile; a block it
    # masks entirely leaves its state bitwise unchanged.
    last_query = tl.minimum(qo_len, (m_start + BLOCK_M - 1) // GROUP + 1) - 1
    hi = kv_len
    if CAUSAL:
        hi = tl.minimum(hi, kv_len - qo_len + last_query + 1)
    lo = tl.minimum(kv_len, 0)  # 0 as an int32 tensor: a loop-carried value cannot start as a constant
    if HAS_WINDOW:
        lo = tl.maximum(0, kv_len - qo_len + m_start // GROUP - window_left)
    lo = lo // BLOCK_N * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float64)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float64)
    acc = tl.zeros([BLOCK_M, BLOCK_DVO], dtype=tl.float64)
    # a while loop, not range(lo, hi, BLOCK_N): Triton 3.6's interpreter cannot take tensor bounds
    # for range under numpy 2 (it calls int() on a 1-element array). The pool loads are gathers
    # through the page table either way, so a for loop's pipelining would buy little.
    start = lo
    while start < hi:
        keys = start + tl.arange(0, BLOCK_N)
        key_valid = keys < kv_len  # slots past kv_len are not the request's: never read them
        page = tl.load(pages_ptr + page_start + keys // page_size, mask=key_valid, other=0)
        k_offsets = (page * stride_kp + (keys % page_size).to(tl.int64) * stride_ks + kv_head * stride_kh)
        kt = tl.load(k_ptr + k_offsets[None, :] + d_qk[:, None], mask=key_valid[None, :] & (d_qk < HEAD_DIM_QK)[:, None], other=0.0)
        s = tl.dot(q, _to_float64(kt, COMPILED))
        if HAS_CAP:
            if COMPILED:
                s = cap * libdevice.tanh(s / cap)
            else:
                e = tl.exp(-2.0 * tl.abs(s / cap))
                t = (1.0 - e) / (1.0 + e)
                s = cap * tl.where(s < 0, -t, t)
        if HAS_ALIBI:
            s -= slope[:, None] * tl.abs(pos[:, None] - keys[None, :]).to(tl.float64)
        keep = row_valid[:, None] & key_valid[None, :]
        if CAUSAL:
            keep &= keys[None, :] <= pos[:, None]
        if HAS_WINDOW:
            keep &= keys[None, :] >= pos[:, None] - window_left
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp(-inf) = 0
        if COMPILED:
            alpha = libdevice.exp(m_i - m_safe)
            p = libdevice.exp(s - m_safe[:, None])
        else:
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_offsets = (page * stride_vp + (keys % page_size).to(tl.int64) * stride_vs + kv_head * stride_vh)
        v = tl.load(v_ptr + v_offsets[:, None] + d_vo[None, :], mask=key_valid[:, None] & (d_vo < HEAD_DIM_VO)[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, _to_float64(v, COMPILED))
        m_i = m_new
        start += BLOCK_N

    empty = l_i == 0.0  # no attended key: out 0, LSE -inf
    l_safe = tl.where(empty, 1.0, l_i)
    if COMPILED:
        lse = tl.where(empty, float("-inf"), m_i + libdevice.log(l_safe))
    else:
        lse = tl.where(empty, float("-inf"), m_i + tl.log(l_safe))
    out = acc / l_safe[:, None] * tl.load(params_ptr + 1)
    if HAS_SINKS:
        # the sink adds e^sink to the denominator only: out * sigmoid(lse - sink)
        sink = tl.load(params_ptr + PARAMS + num_qo_heads + head, mask=row_valid, other=0.0)
        if COMPILED:
            out = out / (1.0 + libdevice.exp(sink - lse))[:, None]
        else:
            out = out / (1.0 + tl.exp(sink - lse))[:, None]
    out_rows = (q_start + query.to(tl.int64)) * stride_ot + head.to(tl.int64) * stride_oh
    tl.store(out_ptr + out_rows[:, None] + d_vo[None, :], out, mask=row_valid[:, None] & (d_vo < HEAD_DIM_VO)[None, :])
    lse_rows = (q_start + query.to(tl.int64)) * stride_lt + head.to(tl.int64)
    tl.store(lse_ptr + lse_rows, lse * tl.load(params_ptr + 3), mask=row_valid)


attention = triton.jit(_attention)


def interpreting() -> bool:
    """Whether the kernel runs in Triton's interpreter: ``TRITON_INTERPRET=1`` when triton was first
    imported (its own library functions are built for one mode, so the mode is per process)."""
    return isinstance(attention, InterpretedFunction)
