"""The float64 reference paged attention, and the plain same-precision control.

``reference`` follows ``pa_oracle.oracle.case`` exactly. It is vectorized over the batch: requests (causal
ones cut into query tiles where that pays) are bucketed by similar lengths so that padding stays
small (``pa_oracle.oracle.buckets``), each bucket is one batched computation over chunks of keys (one chunk
unless the context is long), and the chunks' softmax states are merged, so memory stays bounded.
It runs wherever the tensors are (CPU or CUDA).

On CUDA the cost was the host, not the arithmetic: launches and stream syncs. So every index of
every bucket is built on the host in numpy and moved in one asynchronous copy
(``pa_oracle.oracle.buckets.plan_buckets``), the loop reads only host-side ints and arrays (no ``.item()``,
no boolean-mask indexing, which syncs), a bucket of one request reads its queries and keys as
views, masking touches only the key columns that can hold a masked key and tests only the side
that masks there, the passes that fix rows with no key run only where the host knows there are
such rows, and each chunk's softmax is one fused kernel.

>>> from pa_oracle.oracle.case import Case, Layout, Heads
>>> case = Case(Layout.from_lengths([1], [3], page_size=2), Heads(1, 1, 4, 4))
>>> ref = reference(case, make_tensors(case))
>>> tuple(ref.out.shape), ref.out.dtype
((1, 1, 4), torch.float64)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from pa_oracle.oracle.buckets import Bucket, Plan, plan_buckets
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.result import LOG2_E, Reference, RopeControl
from pa_oracle.oracle.rope import kernel_rotated, rotated
from pa_oracle.oracle.tensors import Tensors, gather_kv, make_tensors, query_values, torch_dtype, upload

_EXPONENT_BITS = 0x7FF0000000000000  # of a float64
_MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}
# float64 bytes live per KV chunk (logits and their softmax, K, V). On CPU each block then stays
# under glibc's 32 MiB mmap threshold (bigger ones are mapped afresh and page-faulted in every time),
# while a chunk is big enough that the per-chunk ops and the merge do not dominate: measured 1.3-2x
# faster than 8 MiB or 128 MiB on a 32-head prefill and an 8-head 8k-context batch. The GPU wants
# big launches.
_CHUNK_BYTES = {"cpu": 1 << 25, "cuda": 1 << 31}


def half_ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Half the spacing of ``dtype`` at each |x|: the bound on rounding x to ``dtype`` (float64).

    0, inf and nan count as lying in [0.5, 1) (``torch.frexp``'s exponent 0).

    >>> half_ulp(torch.tensor([1.0, 3.0], dtype=torch.float64), torch.bfloat16).tolist()
    [0.00390625, 0.0078125]
    """
    x = x.to(torch.float64)
    info = torch.finfo(dtype)
    # The largest power of two <= |x|, read off the exponent bits (0 for float64 subnormals, whose
    # spacing clamps to the smallest one anyway): several times cheaper than frexp and pow.
    exponent = x.view(torch.int64) & _EXPONENT_BITS
    # 0, and inf or nan (all exponent bits set; isfinite would cost 4 operators more)
    binade = torch.where((x == 0) | (exponent == _EXPONENT_BITS), 0.5, exponent.view(torch.float64))
    spacing = binade.mul_(2.0 ** -_MANTISSA_BITS[dtype]).clamp_(min=info.smallest_normal * info.eps)
    return spacing.div_(2)


def _heads_first_kv(case: Case, tensors: Tensors, dtype: torch.dtype, slots: torch.Tensor) -> list[torch.Tensor]:
    """``gather_kv`` as [Hkv, total_kv + 1, D]: heads first, so that ``_kv_of`` gives matmul-ready
    [Hkv, nb, n, D]; the extra zero token is the target of every padded index. ``slots`` [total_kv]
    is each token's flat slot in the pool (``Plan.slots``)."""
    opts, out = case.options, []
    for cache, scale in ((tensors.k_cache, opts.k_scale), (tensors.v_cache, opts.v_scale)):
        stored = cache.flatten(0, 1).index_select(0, slots)
        x = stored.new_empty(stored.shape[1], stored.shape[0] + 1, stored.shape[2], dtype=dtype)
        x[:, :-1], x[:, -1] = stored.transpose(0, 1), 0  # converts and transposes in one pass
        out.append(x.mul_(scale) if opts.is_fp8 else x)
    return out


def _logits(
    case: Case,
    bucket: Bucket,
    q: torch.Tensor,
    k: torch.Tensor,
    cols: slice,
    scale: float,
    alibi: torch.Tensor | None,
    columns: torch.Tensor,
) -> torch.Tensor:
    """Masked logits ``scale * q.k`` [Hkv, nb, G, max_q, chunk] for key columns ``cols``; masked keys
    are -inf. ``q`` is [Hkv, nb, G * max_q, D] and ``k`` [Hkv, nb, chunk, D], in the compute dtype;
    ``alibi`` the slopes as [Hkv, 1, G, 1, 1]; ``columns`` is ``arange(plan.max_kv)`` on the device.

    Masking touches only the columns of ``bucket.masked`` (a decode bucket: the padded tail; a
    causal request: its last ``qo_len`` or so columns), not the whole chunk, and tests only the
    side (``first`` or ``last``) that some real row masks there.
    """
    opts, heads = case.options, case.heads
    s = torch.matmul(q, k.transpose(-1, -2))
    if scale != 1.0:
        s.mul_(scale)
    s = s.view(heads.num_kv_heads, bucket.nb, heads.group_size, -1, s.shape[-1])
    alibi_first = opts.alibi_before_soft_cap  # FlashInfer's order; the default caps first (flash-attn's)
    if opts.logits_soft_cap > 0 and not alibi_first:
        s = s.div_(opts.logits_soft_cap).tanh_().mul_(opts.logits_soft_cap)
    if alibi is not None:
        distance = (bucket.q_pos[:, :, None] - columns[cols]).abs().to(s.dtype)  # [nb, max_q, chunk]
        s.addcmul_(alibi, distance[None, :, None], value=-1.0)
    if alibi_first:
        s = s.div_(opts.logits_soft_cap).tanh_().mul_(opts.logits_soft_cap)
    for a, b in bucket.masked:
        a, b = max(a, cols.start), min(b, cols.stop)
        if a < b:
            j = columns[a:b]
            left, right = bucket.mask_sides(a, b)
            drop = j > bucket.last[:, :, None] if right else j < bucket.first[:, :, None]  # [nb, max_q, b - a]
            if left and right:
                drop |= j < bucket.first[:, :, None]
            s[..., a - cols.start : b - cols.start].masked_fill_(drop[None, :, None], float("-inf"))
    return s


def _kv_of(x: torch.Tensor, bucket: Bucket, cols: slice) -> torch.Tensor:
    """Key columns ``cols`` of the bucket's pieces from ``x`` [Hkv, T, D]: [Hkv, nb, chunk, D]. A
    lone piece's keys are a range of ``x``, read as a view; else gathered (index_select: several
    times faster than advanced indexing on dim 1)."""
    if bucket.contiguous is not None:
        k_start = bucket.contiguous[1]
        return x[:, k_start + cols.start : k_start + cols.stop].unsqueeze(1)
    assert bucket.kv_tokens is not None
    tokens = bucket.kv_tokens[:, cols]
    return x.index_select(1, tokens.reshape(-1)).view(x.shape[0], *tokens.shape, x.shape[-1])


def _padded_q(tensors: Tensors, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """``scale * q`` in ``dtype`` with a zero row appended (the target of padded query rows)."""
    q = tensors.q.new_zeros(tensors.q.shape[0] + 1, *tensors.q.shape[1:], dtype=dtype)
    q[:-1] = tensors.q
    return q.mul_(scale) if scale != 1.0 else q


def _bucket_inputs(case: Case, bucket: Bucket, q: torch.Tensor) -> torch.Tensor:
    """The bucket's queries as [Hkv, nb, G * max_q, D] (``q`` from ``_padded_q``)."""
    heads = case.heads
    if bucket.contiguous is not None:
        qb = q[bucket.contiguous[0] : bucket.contiguous[0] + bucket.max_q]
    else:
        assert bucket.q_rows is not None
        qb = q.index_select(0, bucket.q_rows.flatten())
    qb = qb.view(bucket.nb, bucket.max_q, heads.num_kv_heads, heads.group_size, heads.head_dim_qk)
    return qb.permute(2, 0, 3, 1, 4).flatten(2, 3)


def _weigh(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``p`` [Hkv, nb, G, max_q, chunk] times ``v`` [Hkv, nb, chunk, D] -> [Hkv, nb, G, max_q, D]."""
    return torch.matmul(p.flatten(2, 3), v).view(*p.shape[:-1], v.shape[-1])


def _put_rows(dest: torch.Tensor, bucket: Bucket, x: torch.Tensor) -> None:
    """Write a bucket result ``x`` [Hkv, nb, G, max_q, ...] into the flat rows of ``dest``
    [total_q, Hq, ...]; padded rows are dropped."""
    rows = x.permute(1, 3, 0, 2, *range(4, x.dim())).flatten(0, 1).flatten(1, 2)  # [nb * max_q, Hq, ...]
    if bucket.contiguous is not None:
        dest[bucket.contiguous[0] : bucket.contiguous[0] + bucket.max_q] = rows
    else:
        assert bucket.src is not None and bucket.dst is not None
        dest.index_copy_(0, bucket.dst, rows.index_select(0, bucket.src))


def _per_head(case: Case, values: tuple[float, ...] | None, like: torch.Tensor) -> torch.Tensor | None:
    """Per-qo-head constants (sinks, ALiBi slopes) as [Hkv, 1, G, 1] in ``like``'s dtype and device."""
    if values is None:
        return None
    h = case.heads
    return upload(torch.tensor(values, dtype=like.dtype), like.device).view(h.num_kv_heads, 1, h.group_size, 1)


class _Inputs(NamedTuple):
    plan: Plan
    keys: torch.Tensor  # [Hkv, total_kv + 1, D] (``_heads_first_kv``)
    values: torch.Tensor
    q: torch.Tensor  # ``_padded_q``
    sink: torch.Tensor | None  # [Hkv, 1, G, 1]
    alibi: torch.Tensor | None  # slopes as [Hkv, 1, G, 1, 1]
    columns: torch.Tensor  # ``arange(plan.max_kv)`` on the device


def _inputs(case: Case, tensors: Tensors, dtype: torch.dtype, q_scale: float, plan: Plan | None = None) -> _Inputs:
    """What every bucket loop reads, in ``dtype`` on the tensors' device; q is scaled by ``q_scale``.
    ``plan``: the case's ``plan_buckets`` on that device, if the caller already has it."""
    if plan is None:
        plan = plan_buckets(case, tensors.q.device)
    assert plan.slots.device == tensors.q.device, "a plan made for another device"
    keys, values = _heads_first_kv(case, tensors, dtype, plan.slots)
    q = _padded_q(tensors, dtype, q_scale)
    if case.options.q_is_fp8:  # the stored q's values (``query_values``)
        q.mul_(case.options.q_scale)
    alibi = _per_head(case, case.options.alibi_slopes, q)
    columns = torch.arange(plan.max_kv, device=tensors.q.device)
    return _Inputs(plan, keys, values, q, _per_head(case, case.options.sinks, q), None if alibi is None else alibi[..., None], columns)


class _State(NamedTuple):
    """Attention of some rows over a subset of their keys: the LSE of their logits and the
    softmax-weighted averages of V (and of the ``logit_noise`` terms) over those keys alone."""

    lse: torch.Tensor  # [...]; -inf where the subset holds no attended key
    out: torch.Tensor  # [..., Dvo]; 0 where lse is -inf
    noise_v: torch.Tensor | None  # [..., Dvo] average of half_ulp32(s_j) * |v_j|
    noise_w: torch.Tensor | None  # [...] average of half_ulp32(s_j)


def _attend(s: torch.Tensor, v: torch.Tensor, logit_noise: bool, may_be_empty: bool) -> _State:
    """The state of masked logits ``s`` [..., chunk] over values ``v``.

    One fused softmax instead of separate max / subtract / exp / sum passes over the logits: its
    value at a row's largest logit ``m`` is ``exp(0) / sum_j exp(s_j - m)``, so the row's LSE is
    ``m - log`` of it (exact to an ulp or two of float64). A row whose keys are all masked has a
    NaN softmax; ``may_be_empty=False`` (the host knows no row is) skips the passes that fix those.
    """
    m, at = s.max(-1, keepdim=True)
    p = torch.softmax(s, -1)
    lse = (m - torch.log(p.gather(-1, at))).squeeze(-1)
    out = _weigh(p, v)
    empty = torch.isneginf(m).squeeze(-1) if may_be_empty else None
    if empty is not None:
        lse, out = torch.where(empty, float("-inf"), lse), torch.where(empty[..., None], 0.0, out)
    if not logit_noise:
        return _State(lse, out, None, None)
    weighted = half_ulp(s, torch.float32).mul_(p)  # masked -inf gets a finite bound, and weight 0
    noise_v, noise_w = _weigh(weighted, v.abs()), weighted.sum(-1)
    if empty is not None:
        noise_v, noise_w = torch.where(empty[..., None], 0.0, noise_v), torch.where(empty, 0.0, noise_w)
    return _State(lse, out, noise_v, noise_w)


def _merge(a: _State, b: _State) -> _State:
    """The state over the union of two disjoint key sets; two empty states merge to an empty one."""
    m = torch.maximum(a.lse, b.lse)
    m_safe = torch.where(torch.isinf(m), 0.0, m)
    w_a, w_b = torch.exp(a.lse - m_safe), torch.exp(b.lse - m_safe)
    total = w_a + w_b
    empty = total == 0
    safe_total = torch.where(empty, 1.0, total)
    w_a, w_b = w_a / safe_total, w_b / safe_total

    def mix(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        wx, wy = (w.view(*w.shape, *[1] * (x.dim() - w.dim())) for w in (w_a, w_b))
        return torch.where(empty.view_as(wx), 0.0, wx * x + wy * y)

    lse = torch.where(empty, float("-inf"), m_safe + torch.log(safe_total))
    if a.noise_v is None or b.noise_v is None or a.noise_w is None or b.noise_w is None:
        return _State(lse, mix(a.out, b.out), None, None)
    return _State(lse, mix(a.out, b.out), mix(a.noise_v, b.noise_v), mix(a.noise_w, b.noise_w))


ENGINES = ("auto", "torch", "fused")


# ``auto`` takes the fused kernel only from this many attended float64 flops (2 * pairs * Hq * (Dqk + Dvo)).
# Measured on the H200: torch ~11 TFLOP/s + ~1.6 ms fixed, fused ~25 TFLOP/s + ~0.9 ms (serving batch,
# 255 GFLOP: 22.7 vs 10.2 ms; fuzz-sized: 1.63 vs 0.92 ms, of an ~11 ms judged case), while each new
# Triton specialization costs seconds of compile. From 5e10 the fused kernel saves >= 3 ms a call; the
# largest case the default fuzz Limits draw is ~3.8e10 (6 x 300 keys x 64 queries, 32 heads, dims 256), so
# fuzzing never compiles the oracle and serving-sized cases still get the fast kernel.
FUSED_MIN_FLOPS = 5e10


def attended_flops(case: Case) -> float:
    """Float64 flops of the attended (query, key) pairs of ``case`` (causal masking not subtracted)."""
    pairs = sum(q * k for q, k in zip(case.layout.qo_lens, case.layout.kv_lens))
    return 2.0 * pairs * case.heads.num_qo_heads * (case.heads.head_dim_qk + case.heads.head_dim_vo)


def default_engine() -> str:
    """``PA_ORACLE_ENGINE`` (``auto``, ``torch`` or ``fused``), else ``auto`` (fused from ``FUSED_MIN_FLOPS``)."""
    engine = os.environ.get("PA_ORACLE_ENGINE", "auto")
    if engine not in ENGINES:
        raise ValueError(f"PA_ORACLE_ENGINE must be one of {ENGINES}, got {engine!r}")
    return engine


def reference(
    case: Case,
    tensors: Tensors,
    *,
    lse_base: str = "e",
    chunk_size: int | None = None,
    logit_noise: bool = False,
    engine: str | None = None,
    plan: Plan | None = None,
) -> Reference:
    """Float64 ``(out [total_q, Hq, Dvo], lse [total_q, Hq])`` on the tensors' device.

    ``engine``: ``"torch"`` computes the definition below; ``"fused"`` computes the same quantity
    with one float64 Triton kernel (``pa_oracle.oracle.fused``: CUDA tensors only, ~2x faster, checked against
    this code to ~1e-15 in tests/oracle/test_fused.py); ``"auto"`` (default: ``default_engine()``)
    takes the fused kernel where it applies, no ``chunk_size`` is given and the case has at least
    ``FUSED_MIN_FLOPS`` of work, else this code. The
    result's ``engine`` says which ran; the fuzz runner re-judges every failure with ``"torch"``.
    ``plan``: the case's bucket plan (``shared_plan``), when the caller computes more than one
    oracle quantity of the same case.
    The fused kernel declines custom-mask and MLA cases (``auto`` runs this code on them,
    ``fused`` raises): a masked case is computed one request at a time (``_masked_attention``).

    ``lse_base`` is ``"e"`` (natural log) or ``"2"`` (FlashInfer's convention). Rows with no key
    to attend give out 0 and lse -inf. ``sm_scale`` multiplies q before the dot products (one pass
    over q instead of one over the logits): that moves each logit by about an ulp of float64.

    Each bucket is computed over chunks of at most ``chunk_size`` key columns (default: sized to
    memory); each chunk is attended alone (``_attend``) and the chunk states are merged
    (``_merge``), the split-KV identity the tests check against ``merge_states``.

    ``logit_noise=True`` also returns, per output element, a first-order bound on the error that
    rounding each logit to float32 (every kernel's accumulator) causes:
    ``sum_j p_j * half_ulp32(s_j) * (|v_j| + |out|)``. It is large exactly where softmax is
    peaked on large logits, where any correct fp32 kernel loses digits. For a RoPE case it also
    returns ``rope_control``, the tolerance model's RoPE controls (``rope_control``).
    """
    result = _reference(case, tensors, lse_base=lse_base, chunk_size=chunk_size, logit_noise=logit_noise, engine=engine, plan=plan)
    if logit_noise and case.options.rope is not None:
        result = result._replace(rope_control=rope_control(case, tensors, lse_base=lse_base, plan=plan))
    return result


def rope_control(case: Case, tensors: Tensors, *, lse_base: str = "e", plan: Plan | None = None) -> RopeControl:
    """The tolerance model's RoPE controls of a RoPE case: its float64 attention of q and k rotated as a correct
    float32 RoPE kernel rotates them (``rope.kernel_rotated``), stored in the input dtype (``out``, ``lse``) and
    kept in float32 (``angle_out``, ``angle_lse``: the float32 angles' part alone), V as stored. Their error is
    what those operands alone cost: the attention itself is exact (no rounding of its own). Always this
    module's code (the fused kernel would compile a variant for the rotated operands' dtypes)."""
    unrotated = case.replace(options=dataclasses.replace(case.options, rope=None), positions=None)  # rotated already

    def attend(store: bool) -> Reference:
        return _reference(unrotated, kernel_rotated(case, tensors, store), lse_base=lse_base, engine="torch", plan=plan)

    stored = attend(True)
    kept = attend(False) if 2 in (tensors.q.dtype.itemsize, tensors.k_cache.dtype.itemsize) else stored  # else the same operands
    return RopeControl(stored.out, stored.lse, kept.out, kept.lse)


def _reference(
    case: Case,
    tensors: Tensors,
    *,
    lse_base: str = "e",
    chunk_size: int | None = None,
    logit_noise: bool = False,
    engine: str | None = None,
    plan: Plan | None = None,
) -> Reference:
    """``reference`` without its RoPE control."""
    if lse_base not in ("e", "2"):
        raise ValueError(f"lse_base must be 'e' or '2', got {lse_base!r}")
    engine = engine or default_engine()
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    tensors = rotated(case, tensors)  # RoPE (float64 copies of q and K); the fused kernel declines rope cases
    if case.custom_mask is not None:  # neither the buckets nor the fused kernel take masks (yet)
        if engine == "fused":
            raise ValueError("engine='fused' declines custom-mask cases; use 'auto' or 'torch'")
        result = _masked_attention(case, tensors, torch.float64, chunk_size=chunk_size, logit_noise=logit_noise)
        return result._replace(lse=result.lse * LOG2_E if lse_base == "2" else result.lse)
    wants_fused = engine == "fused" or (engine == "auto" and attended_flops(case) >= FUSED_MIN_FLOPS)
    if wants_fused and chunk_size is None and not case.heads.mla:  # fused: no strided latent V (yet)
        from pa_oracle.oracle.fused import fused_reference  # local: pa_oracle.oracle.fused imports this module

        fast = fused_reference(case, tensors, lse_base=lse_base, logit_noise=logit_noise)
        if fast is not None:
            return fast._replace(engine="fused")
    if engine == "fused":
        if case.heads.mla:
            raise ValueError("engine='fused' declines MLA cases; use 'auto' or 'torch'")
        raise ValueError("engine='fused' needs CUDA tensors, Triton, no chunk_size and a case it takes (pa_oracle.oracle.fused)")
    dtype, device, heads = torch.float64, tensors.q.device, case.heads
    plan, keys, values, q, sink, alibi, columns = _inputs(case, tensors, dtype, case.sm_scale, plan)
    out = q.new_zeros(case.layout.total_q, heads.num_qo_heads, heads.head_dim_vo)
    lse = q.new_full(out.shape[:2], float("-inf"))
    noise = torch.zeros_like(out) if logit_noise else None
    for bucket in plan.buckets:
        qb = _bucket_inputs(case, bucket, q)
        # float64 bytes per key column of a chunk: the logits and their softmax, the gathered K and V
        column = 8 * bucket.nb * (2 * heads.num_qo_heads * bucket.max_q + heads.num_kv_heads * (heads.head_dim_qk + heads.head_dim_vo))
        step = chunk_size or max(1, _CHUNK_BYTES.get(device.type, _CHUNK_BYTES["cpu"]) // column)
        state = None
        for start in range(bucket.first_key, bucket.max_kv, step):  # earlier keys are outside every window
            cols = slice(start, min(start + step, bucket.max_kv))
            s = _logits(case, bucket, qb, _kv_of(keys, bucket, cols), cols, 1.0, alibi, columns)
            part = _attend(s, _kv_of(values, bucket, cols), logit_noise, bucket.has_empty_rows(cols.start, cols.stop))
            state = part if state is None else _merge(state, part)
        assert state is not None, "every bucket has a key column at or after first_key"
        # the sink adds e^sink to the denominator Z = e^lse: the output shrinks by Z / (Z + e^sink)
        shrink = None if sink is None else torch.sigmoid(state.lse - sink)[..., None]
        bucket_out = state.out if shrink is None else state.out * shrink
        _put_rows(out, bucket, bucket_out)
        _put_rows(lse, bucket, state.lse)
        if noise is not None:
            assert state.noise_v is not None and state.noise_w is not None
            bucket_noise = state.noise_v + bucket_out.abs() * state.noise_w[..., None]
            _put_rows(noise, bucket, bucket_noise if shrink is None else bucket_noise * shrink)
    return Reference(out, lse * LOG2_E if lse_base == "2" else lse, noise)


def shared_plan(case: Case, tensors: Tensors) -> Plan | None:
    """The bucket plan that ``reference`` and ``plain_controls`` of ``case`` on ``tensors`` would
    each build (host work and one copy to the device), to build once and pass to both; None for a
    custom-mask case, computed one request at a time without one."""
    return None if case.custom_mask is not None else plan_buckets(case, tensors.q.device)


def plain_attention(
    case: Case, tensors: Tensors, dtype: torch.dtype, *, reorder_ops: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The naive computation every step in ``dtype``: logits, softmax, cast, matmul.

    This is the *control* of the tolerance model (flash-attn's ``attention_ref(upcast=False)``):
    a kernel in ``dtype`` may be as far from the float64 reference as this is, times a factor.
    ``reorder_ops`` scales q before the dot product instead of the logits after it (flash-attn's
    second control): the same precision, rounded differently.
    """
    return plain_controls(case, tensors, dtype, reorders=(reorder_ops,))[0]


def plain_controls(
    case: Case, tensors: Tensors, dtype: torch.dtype, *, reorders: tuple[bool, ...] = (False, True), plan: Plan | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``plain_attention`` with each ``reorder_ops`` of ``reorders`` (the tolerance model's two
    controls), bit for bit, computed together: one plan (or ``plan``), one gather of K and V in
    ``dtype``, and per bucket one gather of its keys and values for all of them."""
    heads = case.heads
    tensors = rotated(case, tensors)  # rotated in float64, then rounded to ``dtype`` as a kernel rounds them
    if case.custom_mask is not None:
        masked = [_masked_attention(case, tensors, dtype, control=True, reorder_ops=r) for r in reorders]
        return [(result.out, result.lse) for result in masked]
    plan, keys, values, q, sink, alibi, columns = _inputs(case, tensors, dtype, 1.0, plan)
    # (q, logit scale) of each control: reorder_ops scales q (in ``dtype``, as ``_padded_q`` would), else the logits
    scaled_q = q.mul(case.sm_scale) if any(reorders) and case.sm_scale != 1.0 else q
    variants = [(scaled_q, 1.0) if r else (q, case.sm_scale) for r in reorders]
    results: list[tuple[torch.Tensor, torch.Tensor]] = []
    for _ in variants:
        out = q.new_zeros(case.layout.total_q, heads.num_qo_heads, heads.head_dim_vo)
        results.append((out, q.new_full(out.shape[:2], float("-inf"))))
    for bucket in plan.buckets:
        cols = slice(bucket.first_key, bucket.max_kv)  # earlier keys are outside every window
        k, v = _kv_of(keys, bucket, cols), _kv_of(values, bucket, cols)
        if v.element_size() < 4:  # CPU BLAS multiplies 16-bit floats 4-8x faster with v laid out [D, kv]
            v = v.transpose(-1, -2).contiguous().transpose(-1, -2)
        may_be_empty = bucket.has_empty_rows(cols.start, cols.stop)  # else the empty-row passes are the identity
        for (variant_q, logit_scale), (out, lse) in zip(variants, results):
            s = _logits(case, bucket, _bucket_inputs(case, bucket, variant_q), k, cols, logit_scale, alibi, columns)
            n_keys = s.shape[-1]
            if sink is not None:
                s = torch.cat([s, sink[..., None].expand(*s.shape[:-1], 1)], dim=-1)
            empty = None
            if may_be_empty:
                # -inf: every key masked (a +inf max is an overflow of ``dtype``: left non-finite, the case is not judged)
                empty = torch.isneginf(s.amax(-1)) if sink is None else torch.isneginf(s[..., :-1].amax(-1))
            bucket_lse = torch.logsumexp(s[..., :n_keys], dim=-1)
            p = torch.softmax(s if empty is None else torch.where(empty[..., None], 0.0, s), dim=-1)
            if case.options.q_is_fp8:
                p = fp8_probabilities(p, torch_dtype(case.options.kv_dtype))
            p = p.to(dtype)
            bucket_out = _weigh(p[..., :n_keys], v)
            if empty is not None:
                bucket_out, bucket_lse = torch.where(empty[..., None], 0.0, bucket_out), torch.where(empty, float("-inf"), bucket_lse)
            _put_rows(out, bucket, bucket_out)
            _put_rows(lse, bucket, bucket_lse)
    return results


FP8_DOT_BITS = 12  # what an fp8 tensor-core dot keeps of sum_i |q_i k_i| (fp8_logit_noise)


def fp8_logit_noise(case: Case, tensors: Tensors) -> torch.Tensor:
    """A bound on how far an fp8 tensor-core kernel's logits, and so its LSE, may be from exact: [total_q, Hq].

    Hopper's fp8 MMA does not accumulate in full float32: it keeps about 14 bits (DeepSeek-V3 technical report,
    section 3.3.2, measured on H800). On the H200, FlashInfer's fa3 fp8 prefill's one-key rows (LSE = the logit) err
    up to 2^-12.5 of ``A = sm_scale * sum_i |q_i k_i|`` (6,144 rows, 2026-12-01: ``benchmarks/h200/fp8_logits.py``).
    The bound is ``2^-FP8_DOT_BITS * sm_scale * |q_row| * max_j |k_j|`` (Euclidean norms; ``A`` is at most that,
    by Cauchy-Schwarz), the key norm's maximum over the case's keys of the row's KV head: an LSE is a p-weighted
    mean of its logits, so it errs by no more than its worst logit. The norms run over the whole logit dim: for MLA
    ``[q_nope | q_pe]`` and the latent row ``[ckv | kpe]``, ``d_ckv + d_kpe`` dims (one dot, however a kernel splits it)."""
    return _logit_noise(case, tensors, lambda d: 2.0**-FP8_DOT_BITS)


FLOAT32_UNIT = 2.0**-24  # float32's unit roundoff


def float32_logit_noise(case: Case, tensors: Tensors) -> torch.Tensor:
    """A bound on how far any kernel's logits, and so its LSE, may be from exact because it sums the ``d``
    products ``q_i k_i`` of a logit in float32 in an order of its own choosing (tensor cores and CPU SIMD alike
    accumulate in float32): ``|ds| <= gamma_(d+1) * sm_scale * sum_i |q_i k_i|`` with ``gamma_n = n u / (1 - n u)``,
    ``u = 2^-24`` (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., (3.5); one more rounding for
    the scale), at most that times ``|q_row| * max_j |k_j|`` by Cauchy-Schwarz, as ``fp8_logit_noise``: [total_q, Hq].

    The LSE's floor is otherwise an ulp of the LSE, and its control (the plain float32 computation) can round to the
    exact logit by chance: a one-key row's LSE is its logit, so a correct float32 kernel summing in another order was
    flagged at 1.3x the allowed error (``tests/test_float32_logit_noise.py``). A planted LSE error beyond this bound
    still fails. The bound only widens the LSE's limit, so ``fuzz.run.runner.judge`` computes it for a failing
    verdict alone."""
    return _logit_noise(case, tensors, lambda d: (d + 1) * FLOAT32_UNIT / (1 - (d + 1) * FLOAT32_UNIT))


def _logit_noise(case: Case, tensors: Tensors, relative: Callable[[int], float]) -> torch.Tensor:
    """``relative(d) * sm_scale * |q_row| * max_j |k_j|`` per (row, q head), ``d`` the logit's length."""
    heads = case.heads
    keys, _ = gather_kv(case, tensors, torch.float64)
    q = query_values(case, tensors, torch.float64)
    key_norm = keys.norm(dim=-1).amax(0) if keys.shape[0] else keys.new_zeros(heads.num_kv_heads)  # [Hkv]
    per_q_head = key_norm.repeat_interleave(heads.group_size)  # [Hq]
    return q.norm(dim=-1) * per_q_head * (case.sm_scale * relative(q.shape[-1]))


def fp8_probabilities(p: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """``p`` rounded as an fp8 attention kernel multiplies P with V (FlashInfer's fa3
    ``StandardFP8Attention::PQuantize``: ``exp(s - row max) * finfo(fp8).max`` cast to fp8; the
    scale is divided out of the sum after): each row scaled so its largest weight is the fp8 max."""
    p32 = p.float()
    row_max = p32.amax(-1, keepdim=True)
    scale = torch.finfo(fp8).max / torch.where(row_max > 0, row_max, 1.0)
    return ((p32 * scale).to(fp8).float() / scale).to(p.dtype)


def _allowed(case: Case, mask: np.ndarray, b: int, device: torch.device) -> torch.Tensor:
    """Request ``b``'s attended keys [qo_len, kv_len]: its custom mask AND causal AND window."""
    qo, kv = mask.shape
    allowed = torch.from_numpy(mask.copy()).to(device)
    q_pos = torch.arange(kv - qo, kv, device=device)[:, None]
    k_pos = torch.arange(kv, device=device)[None, :]
    if case.options.causal:
        allowed &= k_pos <= q_pos
    if case.options.window_left >= 0:
        allowed &= k_pos >= q_pos - case.options.window_left
    return allowed


def _masked_attention(
    case: Case, tensors: Tensors, dtype: torch.dtype, *, chunk_size: int | None = None, logit_noise: bool = False,
    control: bool = False, reorder_ops: bool = False,
) -> Reference:
    """The case with a custom mask, one request at a time (masked cases are draft trees and short
    prefills: no buckets). ``control=False``: the definition in ``dtype`` (float64), chunked and
    merged as ``reference``; ``control=True``: ``plain_attention``'s steps in ``dtype``."""
    heads, opts, lay = case.heads, case.options, case.layout
    masks = case.masks()
    assert masks is not None
    device = tensors.q.device
    keys, values = gather_kv(case, tensors, dtype)
    kv_start = [0]
    for kv_len in lay.kv_lens:
        kv_start.append(kv_start[-1] + kv_len)
    hkv, group = heads.num_kv_heads, heads.group_size
    out = torch.zeros(lay.total_q, heads.num_qo_heads, heads.head_dim_vo, dtype=dtype, device=device)
    lse = torch.full(out.shape[:2], float("-inf"), dtype=dtype, device=device)
    noise = torch.zeros_like(out) if logit_noise else None
    like = torch.empty(0, dtype=dtype, device=device)
    sink, slopes = _per_head(case, opts.sinks, like), _per_head(case, opts.alibi_slopes, like)
    q_scale = case.sm_scale if (reorder_ops or not control) else 1.0
    for b, mask in enumerate(masks):
        qo, kv = mask.shape
        if qo == 0 or kv == 0:
            continue
        rows = slice(lay.qo_indptr[b], lay.qo_indptr[b + 1])
        qb = tensors.q[rows].to(dtype) * q_scale if q_scale != 1.0 else tensors.q[rows].to(dtype)
        qb = qb.view(qo, hkv, group, -1).permute(1, 2, 0, 3).reshape(hkv, 1, group * qo, -1)
        kb = keys[kv_start[b] : kv_start[b + 1]].permute(1, 0, 2)[:, None]  # [Hkv, 1, kv, D]
        vb = values[kv_start[b] : kv_start[b + 1]].permute(1, 0, 2)[:, None]
        allowed = _allowed(case, mask, b, device)
        distance = (torch.arange(kv - qo, kv, device=device)[:, None] - torch.arange(kv, device=device)).abs().to(dtype)
        step = kv if control else (chunk_size or kv)
        state = None
        for start in range(0, kv, step):
            cols = slice(start, min(start + step, kv))
            s = torch.matmul(qb, kb[:, :, cols].transpose(-1, -2)).view(hkv, 1, group, qo, -1)
            if control and not reorder_ops:
                s = s * case.sm_scale
            if opts.logits_soft_cap > 0:
                s = torch.tanh(s / opts.logits_soft_cap) * opts.logits_soft_cap
            if slopes is not None:
                s = s - slopes[..., None] * distance[:, cols]
            s = s.masked_fill(~allowed[:, cols], float("-inf"))
            if control:
                state = _plain_state(s, vb[:, :, cols], sink, dtype)
                break
            part = _attend(s, vb[:, :, cols], logit_noise, may_be_empty=True)
            state = part if state is None else _merge(state, part)
        assert state is not None
        shrink = None if (sink is None or control) else torch.sigmoid(state.lse - sink)[..., None]
        o = state.out if shrink is None else state.out * shrink

        def rows_of(x: torch.Tensor) -> torch.Tensor:  # [Hkv, 1, G, qo, ...] -> [qo, Hq, ...]
            return x[:, 0].movedim(2, 0).flatten(1, 2)

        out[rows], lse[rows] = rows_of(o), rows_of(state.lse)
        if noise is not None:
            assert state.noise_v is not None and state.noise_w is not None
            n = state.noise_v + o.abs() * state.noise_w[..., None]
            noise[rows] = rows_of(n if shrink is None else n * shrink)
    return Reference(out, lse, noise)


def _plain_state(s: torch.Tensor, v: torch.Tensor, sink: torch.Tensor | None, dtype: torch.dtype) -> _State:
    """``plain_attention``'s softmax of ``s`` [..., kv] (sink column appended) and weighting in ``dtype``."""
    n_keys = s.shape[-1]
    empty = torch.isneginf(s.amax(-1))  # every key masked; a +inf max (overflow) stays non-finite
    lse = torch.where(empty, float("-inf"), torch.logsumexp(s, dim=-1))
    if sink is not None:
        s = torch.cat([s, sink[..., None].expand(*s.shape[:-1], 1).to(s.dtype)], dim=-1)
    p = torch.softmax(torch.where(empty[..., None], 0.0, s), dim=-1).to(dtype)
    out = torch.where(empty[..., None], 0.0, _weigh(p[..., :n_keys], v))
    return _State(lse, out, None, None)


def merge_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial attention states over disjoint key sets (natural-log LSE).

    Two empty states (both LSE -inf) merge to out 0, LSE -inf, never NaN.
    """
    state = _merge(_State(lse_a, out_a, None, None), _State(lse_b, out_b, None, None))
    return state.out, state.lse

__all__ = ["ENGINES", "FUSED_MIN_FLOPS", "Reference", "attended_flops", "default_engine", "half_ulp", "reference", "rope_control", "plain_attention", "plain_controls", "shared_plan", "merge_states", "gather_kv", "make_tensors", "LOG2_E"]
