"""BENCHMARK-ONLY COPY of ``oracle/_fused_kernel.py`` at 9bc8e9c, verbatim below this paragraph: the
constexpr-flag kernel (GROUP, head dims and every option compiled in) that
``fused_oracle_speed.py --specializations`` times the runtime-flag kernel against.

The float64 Triton kernel behind ``pa_oracle.oracle.fused``: one program attends one tile of packed
(query, head-in-group) rows of one request against that request's paged keys, for one kv head.

Imported only where Triton is installed. Under ``TRITON_INTERPRET=1`` the kernel runs in Triton's
interpreter (CPU tensors, float64 numpy exp/log instead of libdevice).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.runtime.interpreter import InterpretedFunction

# per tile, int64: first query row, qo_len, kv_len, first page-table entry, first packed row, then
# the key range [begin, end) it attends (a merge tile: its first scratch slot and slot count)
TILE_FIELDS: tl.constexpr = tl.constexpr(7)
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


@triton.jit
def _exp(x, COMPILED: tl.constexpr):
    # tl.exp on float64 is only float32-accurate when compiled; the interpreter's is numpy's float64 exp
    if COMPILED:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def _half_ulp32(s):
    """``pa_oracle.oracle.reference.half_ulp(s, torch.float32)``: half the float32 spacing at |s|, from the
    float64 exponent bits; 0, inf and nan count as lying in [0.5, 1); the spacing is at least the
    smallest float32 subnormal (a binade of at least 2^-126)."""
    exponent = s.to(tl.int64, bitcast=True) & 0x7FF0000000000000
    binade = exponent.to(tl.float64, bitcast=True)
    binade = tl.where((s == 0.0) | (exponent == 0x7FF0000000000000), 0.5, binade)
    return tl.maximum(binade, 2.0**-126) * 2.0**-24


@triton.jit
def _rows(tiles_ptr, pid, num_kv_heads, GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
    """A program's tile-table row, kv head, and its packed rows (query, qo head, validity)."""
    tile = pid // num_kv_heads
    kv_head = pid % num_kv_heads
    info = tiles_ptr + tile.to(tl.int64) * TILE_FIELDS
    q_start = tl.load(info)  # int64: row offsets may exceed 2**31 elements
    qo_len = tl.load(info + 1).to(tl.int32)
    m_start = tl.load(info + 4).to(tl.int32)
    rows = m_start + tl.arange(0, BLOCK_M)
    query = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    return tile, kv_head, info, q_start, qo_len, m_start, query, head, query < qo_len


@triton.jit
def _finish(
    out_ptr, lse_ptr, noise_ptr, params_ptr, acc, l_i, m_i, noise_acc, noise_w,
    q_start, query, head, row_valid, stride_ot, stride_oh, stride_lt, num_qo_heads,
    BLOCK_DVO: tl.constexpr, HEAD_DIM_VO: tl.constexpr, HAS_SINKS: tl.constexpr, LOGIT_NOISE: tl.constexpr, COMPILED: tl.constexpr,
):  # fmt: skip
    """Normalize an online-softmax state and store out, LSE (and logit noise) of its valid rows."""
    empty = l_i == 0.0  # no attended key: out 0, LSE -inf
    l_safe = tl.where(empty, 1.0, l_i)
    if COMPILED:
        lse = tl.where(empty, float("-inf"), m_i + libdevice.log(l_safe))
    else:
        lse = tl.where(empty, float("-inf"), m_i + tl.log(l_safe))
    v_scale = tl.load(params_ptr + 1)
    out = acc / l_safe[:, None] * v_scale
    if HAS_SINKS:
        # the sink adds e^sink to the denominator only: out * sigmoid(lse - sink)
        sink = tl.load(params_ptr + PARAMS + num_qo_heads + head, mask=row_valid, other=0.0)
        shrink = 1.0 + _exp(sink - lse, COMPILED)
        out = out / shrink[:, None]
    d_vo = tl.arange(0, BLOCK_DVO)
    out_rows = (q_start + query.to(tl.int64)) * stride_ot + head.to(tl.int64) * stride_oh
    out_mask = row_valid[:, None] & (d_vo < HEAD_DIM_VO)[None, :]
    tl.store(out_ptr + out_rows[:, None] + d_vo[None, :], out, mask=out_mask)
    if LOGIT_NOISE:
        # reference: (noise_v + |out| * noise_w) * shrink, noise_v and noise_w softmax-weighted averages
        noise = noise_acc / l_safe[:, None] * v_scale + tl.abs(out) * (noise_w / l_safe)[:, None]
        if HAS_SINKS:
            noise = noise / shrink[:, None]
        tl.store(noise_ptr + out_rows[:, None] + d_vo[None, :], noise, mask=out_mask)
    lse_rows = (q_start + query.to(tl.int64)) * stride_lt + head.to(tl.int64)
    tl.store(lse_ptr + lse_rows, lse * tl.load(params_ptr + 3), mask=row_valid)


@triton.jit
def _key_block(
    start, q, m_i, l_i, acc, noise_acc, noise_w, k_ptr, v_ptr, pages_ptr, page_start, kv_len, kv_head,
    pos, row_valid, slope, cap, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, page_size, window_left,
    HEAD_DIM_QK: tl.constexpr, HEAD_DIM_VO: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DVO: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_CAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    LOGIT_NOISE: tl.constexpr, COMPILED: tl.constexpr,
):  # fmt: skip
    """The online-softmax state after key block [start, start + BLOCK_N)."""
    d_qk = tl.arange(0, BLOCK_DQK)
    d_vo = tl.arange(0, BLOCK_DVO)
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
    alpha = _exp(m_i - m_safe, COMPILED)
    p = _exp(s - m_safe[:, None], COMPILED)
    l_i = l_i * alpha + tl.sum(p, 1)
    v_offsets = (page * stride_vp + (keys % page_size).to(tl.int64) * stride_vs + kv_head * stride_vh)
    v = tl.load(v_ptr + v_offsets[:, None] + d_vo[None, :], mask=key_valid[:, None] & (d_vo < HEAD_DIM_VO)[None, :], other=0.0)
    v = _to_float64(v, COMPILED)
    acc = acc * alpha[:, None] + tl.dot(p, v)
    if LOGIT_NOISE:
        weighted = p * _half_ulp32(s)  # a masked -inf logit gets a finite bound and weight 0
        noise_w = noise_w * alpha + tl.sum(weighted, 1)
        noise_acc = noise_acc * alpha[:, None] + tl.dot(weighted, tl.abs(v))
    return m_new, l_i, acc, noise_acc, noise_w


def _attention(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, noise_ptr, tiles_ptr, pages_ptr, params_ptr, part_ptr, part_acc_ptr,
    stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    stride_ot, stride_oh, stride_lt,
    num_kv_heads, num_qo_heads, page_size, window_left, part_stride, part_acc_stride,
    GROUP: tl.constexpr, HEAD_DIM_QK: tl.constexpr, HEAD_DIM_VO: tl.constexpr,
    BLOCK_DQK: tl.constexpr, BLOCK_DVO: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_CAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_SINKS: tl.constexpr, LOGIT_NOISE: tl.constexpr, PARTIAL: tl.constexpr, PIPELINE: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    """One program: one tile's rows for one kv head over the tile's key range. ``PARTIAL``: store the
    unnormalized state (m, l, acc[, noise]) to the scratch slot of the tile for ``_merge`` instead of
    the result. ``PIPELINE`` (compiled only): a ``tl.range`` loop with that many stages, else a
    while loop (Triton 3.6's interpreter cannot take tensor bounds for range under numpy 2)."""
    tile, kv_head, info, q_start, qo_len, m_start, query, head, row_valid = _rows(tiles_ptr, tl.program_id(0), num_kv_heads, GROUP, BLOCK_M)
    kv_len = tl.load(info + 2).to(tl.int32)
    page_start = tl.load(info + 3)
    pos = kv_len - qo_len + query  # bottom-right alignment; negative when qo_len > kv_len
    d_qk = tl.arange(0, BLOCK_DQK)

    q_scale = tl.load(params_ptr)
    q_offsets = (q_start + query.to(tl.int64))[:, None] * stride_qt + head.to(tl.int64)[:, None] * stride_qh
    q = tl.load(q_ptr + q_offsets + d_qk[None, :], mask=row_valid[:, None] & (d_qk < HEAD_DIM_QK)[None, :], other=0.0)
    q = _to_float64(q, COMPILED) * q_scale
    cap = tl.load(params_ptr + 2)
    slope = tl.zeros([BLOCK_M], dtype=tl.float64)
    if HAS_ALIBI:
        slope = tl.load(params_ptr + PARAMS + head, mask=row_valid, other=0.0)

    # Key blocks outside every row's range (or the tile's key range: a split context) are skipped.
    # Blocks stay aligned to multiples of BLOCK_N whatever the tile, so a row sees the same blocks in
    # the same order in any tile; a block it masks entirely leaves its state bitwise unchanged.
    last_query = tl.minimum(qo_len, (m_start + BLOCK_M - 1) // GROUP + 1) - 1
    hi = tl.minimum(kv_len, tl.load(info + 6).to(tl.int32))
    if CAUSAL:
        hi = tl.minimum(hi, kv_len - qo_len + last_query + 1)
    lo = tl.load(info + 5).to(tl.int32)  # an int32 tensor: a loop-carried value cannot start as a constant
    if HAS_WINDOW:
        lo = tl.maximum(lo, kv_len - qo_len + m_start // GROUP - window_left)
    lo = lo // BLOCK_N * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float64)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float64)
    acc = tl.zeros([BLOCK_M, BLOCK_DVO], dtype=tl.float64)
    noise_w = tl.zeros([BLOCK_M], dtype=tl.float64)
    noise_acc = tl.zeros([BLOCK_M, BLOCK_DVO if LOGIT_NOISE else 16], dtype=tl.float64)
    if PIPELINE > 0:
        for start in tl.range(lo, hi, BLOCK_N, num_stages=PIPELINE):
            m_i, l_i, acc, noise_acc, noise_w = _key_block(
                start, q, m_i, l_i, acc, noise_acc, noise_w, k_ptr, v_ptr, pages_ptr, page_start, kv_len, kv_head,
                pos, row_valid, slope, cap, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, page_size, window_left,
                HEAD_DIM_QK, HEAD_DIM_VO, BLOCK_DQK, BLOCK_DVO, BLOCK_N, CAUSAL, HAS_WINDOW, HAS_CAP, HAS_ALIBI, LOGIT_NOISE, COMPILED,
            )  # fmt: skip
    else:
        start = lo
        while start < hi:
            m_i, l_i, acc, noise_acc, noise_w = _key_block(
                start, q, m_i, l_i, acc, noise_acc, noise_w, k_ptr, v_ptr, pages_ptr, page_start, kv_len, kv_head,
                pos, row_valid, slope, cap, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, page_size, window_left,
                HEAD_DIM_QK, HEAD_DIM_VO, BLOCK_DQK, BLOCK_DVO, BLOCK_N, CAUSAL, HAS_WINDOW, HAS_CAP, HAS_ALIBI, LOGIT_NOISE, COMPILED,
            )  # fmt: skip
            start += BLOCK_N

    if PARTIAL:
        # slot rows: (tile, kv head, row in tile); m, l, noise_w at part_ptr + {0, 1, 2} * part_stride
        slot = (tile.to(tl.int64) * num_kv_heads + kv_head) * BLOCK_M + tl.arange(0, BLOCK_M)
        tl.store(part_ptr + slot, m_i)
        tl.store(part_ptr + part_stride + slot, l_i)
        d_vo = tl.arange(0, BLOCK_DVO)
        tl.store(part_acc_ptr + slot[:, None] * BLOCK_DVO + d_vo[None, :], acc)
        if LOGIT_NOISE:
            tl.store(part_ptr + 2 * part_stride + slot, noise_w)
            tl.store(part_acc_ptr + part_acc_stride + slot[:, None] * BLOCK_DVO + d_vo[None, :], noise_acc)
    else:
        _finish(
            out_ptr, lse_ptr, noise_ptr, params_ptr, acc, l_i, m_i, noise_acc, noise_w, q_start, query, head, row_valid,
            stride_ot, stride_oh, stride_lt, num_qo_heads, BLOCK_DVO, HEAD_DIM_VO, HAS_SINKS, LOGIT_NOISE, COMPILED,
        )  # fmt: skip


def _merge(
    out_ptr, lse_ptr, noise_ptr, tiles_ptr, params_ptr, part_ptr, part_acc_ptr,
    stride_ot, stride_oh, stride_lt, num_kv_heads, num_qo_heads, part_stride, part_acc_stride,
    GROUP: tl.constexpr, HEAD_DIM_VO: tl.constexpr, BLOCK_DVO: tl.constexpr, BLOCK_M: tl.constexpr,
    HAS_SINKS: tl.constexpr, LOGIT_NOISE: tl.constexpr, COMPILED: tl.constexpr,
):  # fmt: skip
    """One program: the rows of one split tile for one kv head. Merges the tile's partial states
    (scratch slots ``first .. first + count``, field 5 and 6 of its table row), in slot order, which
    is key order: a deterministic float64 merge, then the same epilogue as ``_attention``."""
    tile, kv_head, info, q_start, qo_len, m_start, query, head, row_valid = _rows(tiles_ptr, tl.program_id(0), num_kv_heads, GROUP, BLOCK_M)
    first = tl.load(info + 5)
    count = tl.load(info + 6)
    rows = tl.arange(0, BLOCK_M)
    d_vo = tl.arange(0, BLOCK_DVO)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float64)
    # while loops: the interpreter cannot take tensor bounds for range (see ``_attention``)
    i = first
    while i < first + count:
        m_i = tl.maximum(m_i, tl.load(part_ptr + (i * num_kv_heads + kv_head) * BLOCK_M + rows))
        i += 1
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float64)
    acc = tl.zeros([BLOCK_M, BLOCK_DVO], dtype=tl.float64)
    noise_w = tl.zeros([BLOCK_M], dtype=tl.float64)
    noise_acc = tl.zeros([BLOCK_M, BLOCK_DVO if LOGIT_NOISE else 16], dtype=tl.float64)
    i = first
    while i < first + count:
        slot = (i * num_kv_heads + kv_head) * BLOCK_M + rows
        scale = _exp(tl.load(part_ptr + slot) - m_safe, COMPILED)  # 0 for an empty part (m -inf)
        l_i += scale * tl.load(part_ptr + part_stride + slot)
        acc += scale[:, None] * tl.load(part_acc_ptr + slot[:, None] * BLOCK_DVO + d_vo[None, :])
        if LOGIT_NOISE:
            noise_w += scale * tl.load(part_ptr + 2 * part_stride + slot)
            noise_acc += scale[:, None] * tl.load(part_acc_ptr + part_acc_stride + slot[:, None] * BLOCK_DVO + d_vo[None, :])
        i += 1
    _finish(
        out_ptr, lse_ptr, noise_ptr, params_ptr, acc, l_i, m_i, noise_acc, noise_w, q_start, query, head, row_valid,
        stride_ot, stride_oh, stride_lt, num_qo_heads, BLOCK_DVO, HEAD_DIM_VO, HAS_SINKS, LOGIT_NOISE, COMPILED,
    )  # fmt: skip


attention = triton.jit(_attention)
merge = triton.jit(_merge)


def interpreting() -> bool:
    """Whether the kernel runs in Triton's interpreter: ``TRITON_INTERPRET=1`` when triton was first
    imported (its own library functions are built for one mode, so the mode is per process)."""
    return isinstance(attention, InterpretedFunction)
