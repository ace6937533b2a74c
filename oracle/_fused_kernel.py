"""The float64 Triton kernel behind ``pa_oracle.oracle.fused``: one program attends one tile of packed
(query, head-in-group) rows of one request against that request's paged keys, for one kv head.

Imported only where Triton is installed. Under ``TRITON_INTERPRET=1`` the kernel runs in Triton's
interpreter (CPU tensors, float64 numpy exp/log instead of libdevice).

What a case changes is a runtime argument, so one compiled kernel serves every group size, head
dim of the same padded block, page size and option: ``group``, ``head_dim_qk``, ``head_dim_vo``
and ``flags`` (a bit per option: ``CAUSAL`` ... ``PARTIAL``). Compile-time (``tl.constexpr``)
stays only what Triton needs to generate code: the tile shape (``BLOCK_M``, ``BLOCK_N``, the
padded head dims ``BLOCK_DQK``/``BLOCK_DVO``, ``BLOCK_NOISE``: tensor shapes are static), the loop
kind (``PIPELINE``: ``tl.range`` stages are a codegen choice) and ``COMPILED`` (libdevice and the
inline-asm cast exist only compiled). ``STATIC`` (a mask of option bits, their values in
``STATIC_FLAGS``) and ``STATIC_GROUP``/``STATIC_DQK``/``STATIC_DVO`` (0: runtime) compile chosen
values in instead: for an option whose runtime test costs speed (``benchmarks/fused_oracle_speed.py
--specializations`` measures each), and to time the difference.

``DO_NOT_SPECIALIZE`` names the int arguments Triton must not specialize on their value (== 1,
divisible by 16): those that vary with the case but never form a vectorized address. The strides
of q, K, V and out keep Triton's divisibility specialization (vectorized loads along the head dim);
so do the head dims (a mask ``d < head_dim`` with ``head_dim`` divisible by 16 keeps 16-wide
vectors), so a key holds whether each is a multiple of 16.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
import triton  # type: ignore[import-untyped]  # triton ships no type information (no py.typed, no stubs)
import triton.language as tl  # type: ignore[import-untyped]  # triton ships no type information (no py.typed, no stubs)
from triton.language.extra import libdevice  # type: ignore[import-untyped]  # triton ships no type information (no py.typed, no stubs)
from triton.runtime.interpreter import InterpretedFunction  # type: ignore[import-untyped]  # triton ships no type information (no py.typed, no stubs)

# per tile, int64: first query row, qo_len, kv_len, first page-table entry, first packed row, then
# the key range [begin, end) it attends (a merge tile: its first scratch slot and slot count)
TILE_FIELDS: tl.constexpr = tl.constexpr(7)
# float64: q scale (sm_scale * k_scale), v_scale, soft cap, LSE scale; then the slopes and sinks per head
PARAMS: tl.constexpr = tl.constexpr(4)
# the bits of ``flags`` (and of ``STATIC``/``STATIC_FLAGS``)
CAUSAL: tl.constexpr = tl.constexpr(1)
HAS_WINDOW: tl.constexpr = tl.constexpr(2)
HAS_CAP: tl.constexpr = tl.constexpr(4)
HAS_ALIBI: tl.constexpr = tl.constexpr(8)
HAS_SINKS: tl.constexpr = tl.constexpr(16)
LOGIT_NOISE: tl.constexpr = tl.constexpr(32)
PARTIAL: tl.constexpr = tl.constexpr(64)
FLAG_BITS = {"causal": 1, "window": 2, "soft_cap": 4, "alibi": 8, "sinks": 16, "logit_noise": 32, "partial": 64}
# case-dependent ints Triton must not specialize on (see the module docstring); per kernel
DO_NOT_SPECIALIZE = {
    "attention": ("table_start", "num_kv_heads", "num_qo_heads", "page_size", "window_left", "stride_lt", "part_stride", "part_acc_stride", "group", "flags"),
    "merge": ("table_start", "stride_lt", "num_kv_heads", "num_qo_heads", "part_stride", "part_acc_stride", "group", "flags"),
}


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
def _rows(tiles_ptr, table_start, pid, num_kv_heads, group, BLOCK_M: tl.constexpr):
    """A program's tile-table row, kv head, and its packed rows (query, qo head, validity)."""
    tile = pid // num_kv_heads
    kv_head = pid % num_kv_heads
    info = tiles_ptr + table_start.to(tl.int64) + tile.to(tl.int64) * TILE_FIELDS
    q_start = tl.load(info)  # int64: row offsets may exceed 2**31 elements
    qo_len = tl.load(info + 1).to(tl.int32)
    m_start = tl.load(info + 4).to(tl.int32)
    rows = m_start + tl.arange(0, BLOCK_M)
    query = rows // group
    head = kv_head * group + rows % group
    return tile, kv_head, info, q_start, qo_len, m_start, query, head, query < qo_len


@triton.jit
def _finish(
    out_ptr, lse_ptr, noise_ptr, params_ptr, acc, l_i, m_i, noise_acc, noise_w,
    q_start, query, head, row_valid, stride_ot, stride_oh, stride_lt, num_qo_heads, head_dim_vo,
    has_sinks, logit_noise, BLOCK_M: tl.constexpr, BLOCK_DVO: tl.constexpr, COMPILED: tl.constexpr,
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
    shrink = tl.full([BLOCK_M], 1.0, dtype=tl.float64)
    if has_sinks:
        # the sink adds e^sink to the denominator only: out * sigmoid(lse - sink)
        sink = tl.load(params_ptr + PARAMS + num_qo_heads + head, mask=row_valid, other=0.0)
        shrink = 1.0 + _exp(sink - lse, COMPILED)
        out = out / shrink[:, None]
    d_vo = tl.arange(0, BLOCK_DVO)
    out_rows = (q_start + query.to(tl.int64)) * stride_ot + head.to(tl.int64) * stride_oh
    out_mask = row_valid[:, None] & (d_vo < head_dim_vo)[None, :]
    tl.store(out_ptr + out_rows[:, None] + d_vo[None, :], out, mask=out_mask)
    if logit_noise:
        # reference: (noise_v + |out| * noise_w) * shrink, noise_v and noise_w softmax-weighted averages
        noise = noise_acc / l_safe[:, None] * v_scale + tl.abs(out) * (noise_w / l_safe)[:, None]
        if has_sinks:
            noise = noise / shrink[:, None]
        tl.store(noise_ptr + out_rows[:, None] + d_vo[None, :], noise, mask=out_mask)
    lse_rows = (q_start + query.to(tl.int64)) * stride_lt + head.to(tl.int64)
    tl.store(lse_ptr + lse_rows, lse * tl.load(params_ptr + 3), mask=row_valid)


@triton.jit
def _key_block(
    start, q, m_i, l_i, acc, noise_acc, noise_w, k_ptr, v_ptr, pages_ptr, page_start, kv_len, kv_head,
    pos, row_valid, slope, cap, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, page_size, window_left,
    head_dim_qk, head_dim_vo, causal, has_window, has_cap, has_alibi, logit_noise,
    BLOCK_DQK: tl.constexpr, BLOCK_DVO: tl.constexpr, BLOCK_N: tl.constexpr, COMPILED: tl.constexpr,
):  # fmt: skip
    """The online-softmax state after key block [start, start + BLOCK_N). The options (``causal``
    ...) are runtime scalars or compile-time constants, as the kernel resolved them."""
    d_qk = tl.arange(0, BLOCK_DQK)
    d_vo = tl.arange(0, BLOCK_DVO)
    keys = start + tl.arange(0, BLOCK_N)
    key_valid = keys < kv_len  # slots past kv_len are not the request's: never read them
    page = tl.load(pages_ptr + page_start + keys // page_size, mask=key_valid, other=0)
    k_offsets = (page * stride_kp + (keys % page_size).to(tl.int64) * stride_ks + kv_head * stride_kh)
    kt = tl.load(k_ptr + k_offsets[None, :] + d_qk[:, None], mask=key_valid[None, :] & (d_qk < head_dim_qk)[:, None], other=0.0)
    s = tl.dot(q, _to_float64(kt, COMPILED))
    if has_cap:
        if COMPILED:
            s = cap * libdevice.tanh(s / cap)
        else:
            e = tl.exp(-2.0 * tl.abs(s / cap))
            t = (1.0 - e) / (1.0 + e)
            s = cap * tl.where(s < 0, -t, t)
    if has_alibi:
        s -= slope[:, None] * tl.abs(pos[:, None] - keys[None, :]).to(tl.float64)
    keep = row_valid[:, None] & key_valid[None, :]
    if causal:
        keep &= keys[None, :] <= pos[:, None]
    if has_window:
        keep &= keys[None, :] >= pos[:, None] - window_left
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp(-inf) = 0
    alpha = _exp(m_i - m_safe, COMPILED)
    p = _exp(s - m_safe[:, None], COMPILED)
    l_i = l_i * alpha + tl.sum(p, 1)
    v_offsets = (page * stride_vp + (keys % page_size).to(tl.int64) * stride_vs + kv_head * stride_vh)
    v = tl.load(v_ptr + v_offsets[:, None] + d_vo[None, :], mask=key_valid[:, None] & (d_vo < head_dim_vo)[None, :], other=0.0)
    v = _to_float64(v, COMPILED)
    acc = acc * alpha[:, None] + tl.dot(p, v)
    if logit_noise:
        weighted = p * _half_ulp32(s)  # a masked -inf logit gets a finite bound and weight 0
        noise_w = noise_w * alpha + tl.sum(weighted, 1)
        noise_acc = noise_acc * alpha[:, None] + tl.dot(weighted, tl.abs(v))
    return m_new, l_i, acc, noise_acc, noise_w


def _attention(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, noise_ptr, ints_ptr, params_ptr, part_ptr, part_acc_ptr,
    stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
    stride_ot, stride_oh, stride_lt,
    table_start, num_kv_heads, num_qo_heads, page_size, window_left, part_stride, part_acc_stride,
    group, head_dim_qk, head_dim_vo, flags,
    BLOCK_DQK: tl.constexpr, BLOCK_DVO: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_NOISE: tl.constexpr, PIPELINE: tl.constexpr, COMPILED: tl.constexpr,
    STATIC: tl.constexpr, STATIC_FLAGS: tl.constexpr, STATIC_GROUP: tl.constexpr, STATIC_DQK: tl.constexpr, STATIC_DVO: tl.constexpr,
):  # fmt: skip
    """One program: one tile's rows for one kv head over the tile's key range; its table row is
    ``table_start`` + tile in ``ints_ptr``, which also holds the page table (field 3 points into
    it). ``PARTIAL``: store the unnormalized state (m, l, acc[, noise]) to the scratch slot of the
    tile for ``_merge`` instead of the result. ``PIPELINE`` (compiled only): a ``tl.range`` loop
    with that many stages, else a while loop (Triton 3.6's interpreter cannot take tensor bounds
    for range under numpy 2)."""
    # each option: compiled in where STATIC says so (a local constexpr: a plain assignment would
    # make it a tensor), else its runtime bit; the constexpr bit on the left (the interpreter
    # passes STATIC as a plain int, which has no & with a constexpr)
    if CAUSAL & STATIC:
        causal: tl.constexpr = (CAUSAL & STATIC_FLAGS) != 0
    else:
        causal = (flags & CAUSAL) != 0
    if HAS_WINDOW & STATIC:
        has_window: tl.constexpr = (HAS_WINDOW & STATIC_FLAGS) != 0
    else:
        has_window = (flags & HAS_WINDOW) != 0
    if HAS_CAP & STATIC:
        has_cap: tl.constexpr = (HAS_CAP & STATIC_FLAGS) != 0
    else:
        has_cap = (flags & HAS_CAP) != 0
    if HAS_ALIBI & STATIC:
        has_alibi: tl.constexpr = (HAS_ALIBI & STATIC_FLAGS) != 0
    else:
        has_alibi = (flags & HAS_ALIBI) != 0
    if HAS_SINKS & STATIC:
        has_sinks: tl.constexpr = (HAS_SINKS & STATIC_FLAGS) != 0
    else:
        has_sinks = (flags & HAS_SINKS) != 0
    if LOGIT_NOISE & STATIC:
        logit_noise: tl.constexpr = (LOGIT_NOISE & STATIC_FLAGS) != 0
    else:
        logit_noise = (flags & LOGIT_NOISE) != 0
    if PARTIAL & STATIC:
        partial: tl.constexpr = (PARTIAL & STATIC_FLAGS) != 0
    else:
        partial = (flags & PARTIAL) != 0
    if STATIC_GROUP:
        n_group: tl.constexpr = STATIC_GROUP
    else:
        n_group = group
    if STATIC_DQK:
        dim_qk: tl.constexpr = STATIC_DQK
        dim_vo: tl.constexpr = STATIC_DVO
    else:
        dim_qk = head_dim_qk
        dim_vo = head_dim_vo

    tile, kv_head, info, q_start, qo_len, m_start, query, head, row_valid = _rows(ints_ptr, table_start, tl.program_id(0), num_kv_heads, n_group, BLOCK_M)
    kv_len = tl.load(info + 2).to(tl.int32)
    page_start = tl.load(info + 3)
    pos = kv_len - qo_len + query  # bottom-right alignment; negative when qo_len > kv_len
    d_qk = tl.arange(0, BLOCK_DQK)

    q_scale = tl.load(params_ptr)
    q_offsets = (q_start + query.to(tl.int64))[:, None] * stride_qt + head.to(tl.int64)[:, None] * stride_qh
    q = tl.load(q_ptr + q_offsets + d_qk[None, :], mask=row_valid[:, None] & (d_qk < dim_qk)[None, :], other=0.0)
    q = _to_float64(q, COMPILED) * q_scale
    cap = tl.load(params_ptr + 2)
    slope = tl.zeros([BLOCK_M], dtype=tl.float64)
    if has_alibi:
        slope = tl.load(params_ptr + PARAMS + head, mask=row_valid, other=0.0)

    # Key blocks outside every row's range (or the tile's key range: a split context) are skipped.
    # Blocks stay aligned to multiples of BLOCK_N whatever the tile, so a row sees the same blocks in
    # the same order in any tile; a block it masks entirely leaves its state bitwise unchanged.
    last_query = tl.minimum(qo_len, (m_start + BLOCK_M - 1) // n_group + 1) - 1
    hi = tl.minimum(kv_len, tl.load(info + 6).to(tl.int32))
    if causal:
        hi = tl.minimum(hi, kv_len - qo_len + last_query + 1)
    lo = tl.load(info + 5).to(tl.int32)  # an int32 tensor: a loop-carried value cannot start as a constant
    if has_window:
        lo = tl.maximum(lo, kv_len - qo_len + m_start // n_group - window_left)
    lo = lo // BLOCK_N * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float64)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float64)
    acc = tl.zeros([BLOCK_M, BLOCK_DVO], dtype=tl.float64)
    noise_w = tl.zeros([BLOCK_M], dtype=tl.float64)
    noise_acc = tl.zeros([BLOCK_M, BLOCK_NOISE], dtype=tl.float64)
    if PIPELINE > 0:
        for start in tl.range(lo, hi, BLOCK_N, num_stages=PIPELINE):
            m_i, l_i, acc, noise_acc, noise_w = _key_block(
                start, q, m_i, l_i, acc, noise_acc, noise_w, k_ptr, v_ptr, ints_ptr, page_start, kv_len, kv_head,
                pos, row_valid, slope, cap, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, page_size, window_left,
                dim_qk, dim_vo, causal, has_window, has_cap, has_alibi, logit_noise, BLOCK_DQK, BLOCK_DVO, BLOCK_N, COMPILED,
            )  # fmt: skip
    else:
        start = lo
        while start < hi:
            m_i, l_i, acc, noise_acc, noise_w = _key_block(
                start, q, m_i, l_i, acc, noise_acc, noise_w, k_ptr, v_ptr, ints_ptr, page_start, kv_len, kv_head,
                pos, row_valid, slope, cap, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, page_size, window_left,
                dim_qk, dim_vo, causal, has_window, has_cap, has_alibi, logit_noise, BLOCK_DQK, BLOCK_DVO, BLOCK_N, COMPILED,
            )  # fmt: skip
            start += BLOCK_N

    if partial:
        # slot rows: (tile, kv head, row in tile); m, l, noise_w at part_ptr + {0, 1, 2} * part_stride
        slot = (tile.to(tl.int64) * num_kv_heads + kv_head) * BLOCK_M + tl.arange(0, BLOCK_M)
        tl.store(part_ptr + slot, m_i)
        tl.store(part_ptr + part_stride + slot, l_i)
        d_vo = tl.arange(0, BLOCK_DVO)
        tl.store(part_acc_ptr + slot[:, None] * BLOCK_DVO + d_vo[None, :], acc)
        if logit_noise:
            tl.store(part_ptr + 2 * part_stride + slot, noise_w)
            tl.store(part_acc_ptr + part_acc_stride + slot[:, None] * BLOCK_DVO + d_vo[None, :], noise_acc)
    else:
        _finish(
            out_ptr, lse_ptr, noise_ptr, params_ptr, acc, l_i, m_i, noise_acc, noise_w, q_start, query, head, row_valid,
            stride_ot, stride_oh, stride_lt, num_qo_heads, dim_vo, has_sinks, logit_noise, BLOCK_M, BLOCK_DVO, COMPILED,
        )  # fmt: skip


def _merge(
    out_ptr, lse_ptr, noise_ptr, ints_ptr, params_ptr, part_ptr, part_acc_ptr,
    stride_ot, stride_oh, stride_lt, table_start, num_kv_heads, num_qo_heads, part_stride, part_acc_stride,
    group, head_dim_vo, flags,
    BLOCK_DVO: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_NOISE: tl.constexpr, COMPILED: tl.constexpr,
    STATIC: tl.constexpr, STATIC_FLAGS: tl.constexpr, STATIC_GROUP: tl.constexpr, STATIC_DVO: tl.constexpr,
):  # fmt: skip
    """One program: the rows of one split tile for one kv head. Merges the tile's partial states
    (scratch slots ``first .. first + count``, field 5 and 6 of its table row), in slot order, which
    is key order: a deterministic float64 merge, then the same epilogue as ``_attention``."""
    if HAS_SINKS & STATIC:
        has_sinks: tl.constexpr = (HAS_SINKS & STATIC_FLAGS) != 0
    else:
        has_sinks = (flags & HAS_SINKS) != 0
    if LOGIT_NOISE & STATIC:
        logit_noise: tl.constexpr = (LOGIT_NOISE & STATIC_FLAGS) != 0
    else:
        logit_noise = (flags & LOGIT_NOISE) != 0
    if STATIC_GROUP:
        n_group: tl.constexpr = STATIC_GROUP
    else:
        n_group = group
    if STATIC_DVO:
        dim_vo: tl.constexpr = STATIC_DVO
    else:
        dim_vo = head_dim_vo
    tile, kv_head, info, q_start, qo_len, m_start, query, head, row_valid = _rows(ints_ptr, table_start, tl.program_id(0), num_kv_heads, n_group, BLOCK_M)
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
    noise_acc = tl.zeros([BLOCK_M, BLOCK_NOISE], dtype=tl.float64)
    i = first
    while i < first + count:
        slot = (i * num_kv_heads + kv_head) * BLOCK_M + rows
        scale = _exp(tl.load(part_ptr + slot) - m_safe, COMPILED)  # 0 for an empty part (m -inf)
        l_i += scale * tl.load(part_ptr + part_stride + slot)
        acc += scale[:, None] * tl.load(part_acc_ptr + slot[:, None] * BLOCK_DVO + d_vo[None, :])
        if logit_noise:
            noise_w += scale * tl.load(part_ptr + 2 * part_stride + slot)
            noise_acc += scale[:, None] * tl.load(part_acc_ptr + part_acc_stride + slot[:, None] * BLOCK_DVO + d_vo[None, :])
        i += 1
    _finish(
        out_ptr, lse_ptr, noise_ptr, params_ptr, acc, l_i, m_i, noise_acc, noise_w, q_start, query, head, row_valid,
        stride_ot, stride_oh, stride_lt, num_qo_heads, dim_vo, has_sinks, logit_noise, BLOCK_M, BLOCK_DVO, COMPILED,
    )  # fmt: skip


attention = triton.jit(_attention, do_not_specialize=DO_NOT_SPECIALIZE["attention"])
merge = triton.jit(_merge, do_not_specialize=DO_NOT_SPECIALIZE["merge"])
RAW: dict[str, Callable[..., None]] = {"attention": _attention, "merge": _merge}  # the undecorated kernels


def specialization_key(fn: Callable, do_not_specialize: Iterable[str], args: Sequence[object], kwargs: Mapping[str, object]) -> tuple:
    """The key Triton compiles ``triton.jit(fn, do_not_specialize=...)[grid](*args, **kwargs)``
    under, by its documented rules: every ``tl.constexpr`` value; per other argument its type,
    and unless ``do_not_specialize`` names it, an int's value 1 or divisibility by 16 and a
    tensor's 16-byte alignment; the launch options. Launches with equal keys share one compiled
    kernel (a test checks this against Triton's own cache on CUDA)."""
    params = inspect.signature(fn).parameters
    bound = dict(zip(params, args)) | {name: value for name, value in kwargs.items() if name in params}
    skip = set(do_not_specialize)
    spec = []
    for name, param in params.items():
        value = bound[name]
        if "constexpr" in str(param.annotation):
            spec.append((name, "constexpr", value))
        else:
            spec.append((name, *_specialization(value, name not in skip)))
    options = tuple(sorted((name, value) for name, value in kwargs.items() if name not in params))
    return (fn.__name__, tuple(spec), options)


def _specialization(value: object, specialize: bool) -> tuple:
    if isinstance(value, bool):
        return ("u1",)
    if isinstance(value, int):
        kind = "i32" if -(2**31) <= value < 2**31 else "u64" if value >= 2**63 else "i64"
        if not specialize:
            return (kind,)
        return ("constexpr", 1) if value == 1 else (kind, "D" if value % 16 == 0 else "")
    if isinstance(value, float):
        return ("fp32",)
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), "D" if value.data_ptr() % 16 == 0 else "")
    raise TypeError(f"no Triton specialization rule for {type(value).__name__}")


def interpreting() -> bool:
    """Whether the kernel runs in Triton's interpreter: ``TRITON_INTERPRET=1`` when triton was first
    imported (its own library functions are built for one mode, so the mode is per process)."""
    return isinstance(attention, InterpretedFunction)
