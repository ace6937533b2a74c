"""The float64 reference paged attention, and the plain same-precision control.

``reference`` follows ``oracle.case`` exactly. It is vectorized over the batch: requests are
bucketed by query count (powers of two, so padding at most doubles the work), each bucket is one
batched computation with an online softmax over KV chunks, so memory stays bounded at long
context. It runs wherever the tensors are (CPU or CUDA).

>>> from oracle.case import Case, Layout, Heads
>>> case = Case(Layout.from_lengths([1], [3], page_size=2), Heads(1, 1, 4, 4))
>>> ref = reference(case, make_tensors(case))
>>> tuple(ref.out.shape), ref.out.dtype
((1, 1, 4), torch.float64)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from oracle.case import Case
from oracle.tensors import Tensors, make_tensors, token_addresses

LOG2_E = 1.0 / math.log(2.0)
_MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}
_CHUNK_BYTES = {"cpu": 1 << 27, "cuda": 1 << 31}  # logits kept live per KV chunk


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
    binade = (x.view(torch.int64) & 0x7FF0000000000000).view(torch.float64)
    binade = torch.where((x == 0) | ~torch.isfinite(x), 0.5, binade)
    spacing = binade.mul_(2.0 ** -_MANTISSA_BITS[dtype]).clamp_(min=info.smallest_normal * info.eps)
    return spacing.div_(2)


def gather_kv(case: Case, tensors: Tensors, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantized keys and values of every token, logical order: [total_kv, Hkv, D] in ``dtype``."""
    pages, slots = (t.to(tensors.k_cache.device) for t in token_addresses(case))
    opts = case.options
    keys = tensors.k_cache[pages, slots].to(dtype)
    values = tensors.v_cache[pages, slots].to(dtype)
    if opts.is_fp8:
        keys, values = keys * opts.k_scale, values * opts.v_scale
    return keys, values


@dataclass(frozen=True)
class _Bucket:
    """Requests padded to ``max_q`` queries and ``max_kv`` keys, as index tensors."""

    q_rows: torch.Tensor  # [nb, max_q] row into q (0 for padding); q_valid marks real rows
    q_valid: torch.Tensor
    q_pos: torch.Tensor  # [nb, max_q] absolute position of each query
    kv_tokens: torch.Tensor  # [nb, max_kv] token into the gathered K/V; padding -> the zero row
    kv_len: torch.Tensor  # [nb]
    first_key: int  # no query of the bucket sees a key before this one (sliding window)


_PAD_RATIO = 1.25  # a bucket's padded work (nb * max_q * max_kv) may exceed its real work by this factor,
_PAD_FREE = 1 << 15  # or by this many query-key pairs: cheaper than the fixed cost of one more bucket


def _groups(qo_lens: tuple[int, ...], kv_lens: tuple[int, ...]) -> list[list[int]]:
    """Requests with queries, sorted by (qo_len, kv_len) and cut greedily into buckets of
    bounded padding (see ``_PAD_RATIO``). Depends only on the lengths, not the request order."""
    groups: list[list[int]] = []
    real = longest = 0
    for b in sorted((b for b, n in enumerate(qo_lens) if n), key=lambda b: (qo_lens[b], kv_lens[b])):
        qo, kv = qo_lens[b], max(kv_lens[b], 1)  # sorted: qo is the bucket's largest
        if groups:
            padded, grown = (len(groups[-1]) + 1) * qo * max(longest, kv), real + qo * kv
            if padded <= _PAD_RATIO * grown or padded - grown <= _PAD_FREE:
                groups[-1].append(b)
                real, longest = grown, max(longest, kv)
                continue
        groups.append([b])
        real, longest = qo * kv, kv
    return groups


def _buckets(case: Case, device: torch.device) -> list[_Bucket]:
    layout, window = case.layout, case.options.window_left
    kv_start = [0]
    for n in layout.kv_lens:
        kv_start.append(kv_start[-1] + n)
    buckets = []
    for group in _groups(layout.qo_lens, layout.kv_lens):
        lengths = [(layout.qo_lens[b], layout.kv_lens[b], layout.qo_indptr[b], kv_start[b]) for b in group]
        qo_len, kv_len, q_start, k_start = torch.tensor(lengths, device=device).T
        i = torch.arange(max(n for n, *_ in lengths), device=device)
        j = torch.arange(max(max(n for _, n, *_ in lengths), 1), device=device)
        q_valid = i[None, :] < qo_len[:, None]
        first_query = min(kv - qo for qo, kv, *_ in lengths)  # position of the bucket's earliest query
        buckets.append(
            _Bucket(
                q_rows=torch.where(q_valid, q_start[:, None] + i, 0),
                q_valid=q_valid,
                q_pos=(kv_len - qo_len)[:, None] + i,
                kv_tokens=torch.where(j[None, :] < kv_len[:, None], k_start[:, None] + j, kv_start[-1]),
                kv_len=kv_len,
                first_key=max(0, first_query - window) if window >= 0 else 0,
            )
        )
    return buckets


def _logits(case: Case, bucket: _Bucket, q: torch.Tensor, k: torch.Tensor, cols: slice) -> torch.Tensor:
    """Masked logits [Hkv, nb, G, max_q, chunk] for key columns ``cols``; masked keys are -inf.

    ``q`` is [Hkv, nb, G * max_q, D] and ``k`` [Hkv, nb, chunk, D], both in the compute dtype.
    """
    opts, heads = case.options, case.heads
    s = torch.matmul(q, k.transpose(-1, -2)).mul_(case.sm_scale)
    s = s.view(heads.num_kv_heads, *bucket.q_rows.shape[:1], heads.group_size, -1, s.shape[-1])
    if opts.logits_soft_cap > 0:
        s = s.div_(opts.logits_soft_cap).tanh_().mul_(opts.logits_soft_cap)
    k_pos = torch.arange(cols.start, cols.stop, device=s.device)
    q_pos = bucket.q_pos[:, :, None]  # [nb, max_q, 1]
    keep = (k_pos[None, None, :] < bucket.kv_len[:, None, None]) & bucket.q_valid[:, :, None]
    if opts.causal:
        keep &= k_pos[None, None, :] <= q_pos
    if opts.window_left >= 0:
        keep &= k_pos[None, None, :] >= q_pos - opts.window_left
    if opts.alibi_slopes is not None:
        slopes = torch.tensor(opts.alibi_slopes, dtype=s.dtype, device=s.device).view(
            heads.num_kv_heads, 1, heads.group_size, 1, 1
        )
        distance = (q_pos - k_pos[None, None, :]).abs().to(s.dtype)
        s = s.sub_(slopes * distance[None, :, None])
    return s.masked_fill_(~keep[None, :, None], float("-inf"))


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """[tokens, Hkv, D] -> [Hkv, tokens + 1, D]: one appended zero token, the target of every
    padded KV index; heads first, so that gathering a chunk gives matmul-ready [Hkv, nb, chunk, D]."""
    out = x.new_zeros(x.shape[1], x.shape[0] + 1, x.shape[2])
    out[:, :-1] = x.transpose(0, 1)
    return out


def _bucket_inputs(case: Case, bucket: _Bucket, q: torch.Tensor) -> torch.Tensor:
    """The bucket's queries as [Hkv, nb, G * max_q, D], zero in padded rows."""
    heads = case.heads
    qb = q[bucket.q_rows] * bucket.q_valid[..., None, None]
    qb = qb.view(*bucket.q_rows.shape, heads.num_kv_heads, heads.group_size, heads.head_dim_qk)
    return qb.permute(2, 0, 3, 1, 4).flatten(2, 3)


def _weigh(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``p`` [Hkv, nb, G, max_q, chunk] times ``v`` [Hkv, nb, chunk, D] -> [Hkv, nb, G, max_q, D].

    ``v`` goes in as the transpose of a contiguous [D, chunk]: CPU BLAS is faster so (bf16: 5x).
    """
    v_t = v.transpose(-1, -2).contiguous().transpose(-1, -2)
    return torch.matmul(p.flatten(2, 3), v_t).view(*p.shape[:-1], v.shape[-1])


def _scatter(case: Case, buckets: list[_Bucket], results: list[tuple[torch.Tensor, torch.Tensor]], like: torch.Tensor):
    """Put per-bucket [Hkv, nb, G, max_q, ...] results back into flat [total_q, Hq, ...] rows."""
    heads, total_q = case.heads, case.layout.total_q
    out = like.new_zeros(total_q, heads.num_qo_heads, heads.head_dim_vo)
    lse = like.new_full((total_q, heads.num_qo_heads), float("-inf"))
    for bucket, (o, l) in zip(buckets, results):
        rows, valid = bucket.q_rows[bucket.q_valid], bucket.q_valid
        out[rows] = o.permute(1, 3, 0, 2, 4)[valid].flatten(1, 2)
        lse[rows] = l.permute(1, 3, 0, 2)[valid].flatten(1, 2)
    return out, lse


def _sink_logits(case: Case, like: torch.Tensor) -> torch.Tensor | None:
    if case.options.sinks is None:
        return None
    h = case.heads
    return torch.tensor(case.options.sinks, dtype=like.dtype, device=like.device).view(
        h.num_kv_heads, 1, h.group_size, 1
    )


class Reference(NamedTuple):
    out: torch.Tensor  # [total_q, Hq, Dvo] float64
    lse: torch.Tensor  # [total_q, Hq] float64
    logit_noise: torch.Tensor | None  # [total_q, Hq, Dvo]: see ``reference``


def reference(
    case: Case,
    tensors: Tensors,
    *,
    lse_base: str = "e",
    chunk_size: int | None = None,
    logit_noise: bool = False,
) -> Reference:
    """Float64 ``(out [total_q, Hq, Dvo], lse [total_q, Hq])`` on the tensors' device.

    ``lse_base`` is ``"e"`` (natural log) or ``"2"`` (FlashInfer's convention). Rows with no key
    to attend give out 0 and lse -inf.

    ``logit_noise=True`` also returns, per output element, a first-order bound on the error that
    rounding each logit to float32 (every kernel's accumulator) causes:
    ``sum_j p_j * half_ulp32(s_j) * (|v_j| + |out|)``. It is large exactly where softmax is
    peaked on large logits, where any correct fp32 kernel loses digits.
    """
    if lse_base not in ("e", "2"):
        raise ValueError(f"lse_base must be 'e' or '2', got {lse_base!r}")
    dtype, device = torch.float64, tensors.q.device
    keys, values = (_heads_first(x) for x in gather_kv(case, tensors, dtype))
    abs_values = values.abs() if logit_noise else None
    q = tensors.q.to(dtype)
    buckets = _buckets(case, device)
    sink = _sink_logits(case, q)
    results = []
    for bucket in buckets:
        qb = _bucket_inputs(case, bucket, q)
        nb, max_q, max_kv = *bucket.q_rows.shape, bucket.kv_tokens.shape[1]
        budget = _CHUNK_BYTES.get(device.type, _CHUNK_BYTES["cpu"])
        step = chunk_size or max(1, budget // (8 * nb * case.heads.num_qo_heads * max_q))
        m = q.new_full((case.heads.num_kv_heads, nb, case.heads.group_size, max_q), float("-inf"))
        denom = torch.zeros_like(m)
        acc = q.new_zeros(*m.shape, case.heads.head_dim_vo)
        noise_v, noise_w = torch.zeros_like(acc), torch.zeros_like(m)
        for start in range(bucket.first_key, max_kv, step):  # earlier keys are outside every window
            cols = slice(start, min(start + step, max_kv))
            tokens = bucket.kv_tokens[:, cols]
            s = _logits(case, bucket, qb, keys[:, tokens], cols)
            m_new = torch.maximum(m, s.amax(-1))
            m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)  # all -inf so far: nothing to rescale
            if logit_noise:
                ulp = half_ulp(s, torch.float32)  # masked -inf gets a finite bound, and weight 0
            p = s.sub_(m_safe[..., None]).exp_()  # in place: s is not needed any more
            rescale = torch.exp(m - m_safe)
            denom = denom * rescale + p.sum(-1)
            acc = acc * rescale[..., None] + _weigh(p, values[:, tokens])
            if logit_noise:
                weighted = ulp.mul_(p)
                noise_v = noise_v * rescale[..., None] + _weigh(weighted, abs_values[:, tokens])
                noise_w = noise_w * rescale + weighted.sum(-1)
            m = m_new
        empty = denom == 0
        total = denom if sink is None else denom + torch.exp(sink - torch.where(empty, 0.0, m))
        out = torch.where(empty[..., None], 0.0, acc / torch.where(empty, 1.0, total)[..., None])
        lse = torch.where(empty, float("-inf"), m + torch.log(torch.where(empty, 1.0, denom)))
        safe_total = torch.where(empty, 1.0, total)[..., None]
        noise = (noise_v + out.abs() * noise_w[..., None]) / safe_total
        results.append((out, lse, noise))
    out, lse = _scatter(case, buckets, [r[:2] for r in results], q)
    noise_out = _scatter(case, buckets, [(r[2], r[1]) for r in results], q)[0] if logit_noise else None
    return Reference(out, lse * LOG2_E if lse_base == "2" else lse, noise_out)


def plain_attention(
    case: Case, tensors: Tensors, dtype: torch.dtype, *, reorder_ops: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The naive computation every step in ``dtype``: logits, softmax, cast, matmul.

    This is the *control* of the tolerance model (flash-attn's ``attention_ref(upcast=False)``):
    a kernel in ``dtype`` may be as far from the float64 reference as this is, times a factor.
    ``reorder_ops`` scales q before the dot product instead of the logits after it (flash-attn's
    second control): the same precision, rounded differently.
    """
    keys, values = (_heads_first(x) for x in gather_kv(case, tensors, dtype))
    q = tensors.q.to(dtype)
    if reorder_ops:
        q = q * case.sm_scale
        case = case.replace(options=dataclasses.replace(case.options, sm_scale=1.0))
    buckets = _buckets(case, q.device)
    sink = _sink_logits(case, q)
    results = []
    for bucket in buckets:
        max_kv = bucket.kv_tokens.shape[1]
        s = _logits(case, bucket, _bucket_inputs(case, bucket, q), keys[:, bucket.kv_tokens], slice(0, max_kv))
        if sink is not None:
            s = torch.cat([s, sink[..., None].expand(*s.shape[:-1], 1)], dim=-1)
        empty = torch.isinf(s.amax(-1)) if sink is None else torch.isinf(s[..., :-1].amax(-1))
        lse = torch.logsumexp(s[..., :max_kv], dim=-1)
        p = torch.softmax(torch.where(empty[..., None], 0.0, s), dim=-1).to(dtype)
        out = _weigh(p[..., :max_kv], values[:, bucket.kv_tokens])
        results.append((torch.where(empty[..., None], 0.0, out), torch.where(empty, float("-inf"), lse)))
    return _scatter(case, buckets, results, q)


def merge_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial attention states over disjoint key sets (natural-log LSE).

    Two empty states (both LSE -inf) merge to out 0, LSE -inf, never NaN.
    """
    m = torch.maximum(lse_a, lse_b)
    m_safe = torch.where(torch.isinf(m), 0.0, m)
    w_a, w_b = torch.exp(lse_a - m_safe), torch.exp(lse_b - m_safe)
    total = w_a + w_b
    empty = total == 0
    safe_total = torch.where(empty, 1.0, total)
    out = (w_a[..., None] * out_a + w_b[..., None] * out_b) / safe_total[..., None]
    lse = torch.where(empty, float("-inf"), m_safe + torch.log(safe_total))
    return torch.where(empty[..., None], 0.0, out), lse


__all__ = ["Reference", "half_ulp", "reference", "plain_attention", "merge_states", "gather_kv", "make_tensors", "LOG2_E"]
