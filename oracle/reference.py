"""The float64 reference paged attention, and the plain same-precision control.

``reference`` follows ``oracle.case`` exactly. It is vectorized over the batch: requests (causal
ones cut into query tiles, see ``_pieces``) are bucketed by similar lengths so that padding stays
small (``_groups``), each bucket is one batched computation with an online softmax over KV chunks,
so memory stays bounded at long context. It runs wherever the tensors are (CPU or CUDA).

>>> from oracle.case import Case, Layout, Heads
>>> case = Case(Layout.from_lengths([1], [3], page_size=2), Heads(1, 1, 4, 4))
>>> ref = reference(case, make_tensors(case))
>>> tuple(ref.out.shape), ref.out.dtype
((1, 1, 4), torch.float64)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from oracle.case import Case
from oracle.tensors import Tensors, make_tensors, token_addresses

LOG2_E = 1.0 / math.log(2.0)
_MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}
# float64 bytes live per KV chunk (logits, K, V). On CPU a few MiB stay in cache and in the
# allocator's pool (glibc maps every block of 32 MiB or more afresh, page-faulting it in): measured
# 1.2-1.5x faster than 128 MiB chunks. The GPU wants big launches.
_CHUNK_BYTES = {"cpu": 1 << 23, "cuda": 1 << 31}


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


def _heads_first_kv(case: Case, tensors: Tensors, dtype: torch.dtype) -> list[torch.Tensor]:
    """``gather_kv`` as [Hkv, total_kv + 1, D]: heads first, so that ``_gather`` gives matmul-ready
    [Hkv, nb, n, D]; the extra zero token is the target of every padded index."""
    pages, slots = (t.to(tensors.k_cache.device) for t in token_addresses(case))
    opts, out = case.options, []
    for cache, scale in ((tensors.k_cache, opts.k_scale), (tensors.v_cache, opts.v_scale)):
        stored = cache[pages, slots]
        x = stored.new_empty(stored.shape[1], stored.shape[0] + 1, stored.shape[2], dtype=dtype)
        x[:, :-1], x[:, -1] = stored.transpose(0, 1), 0  # converts and transposes in one pass
        out.append(x.mul_(scale) if opts.is_fp8 else x)
    return out


@dataclass(frozen=True)
class _Bucket:
    """Requests padded to ``max_q`` queries and ``max_kv`` keys, as index tensors."""

    q_rows: torch.Tensor  # [nb, max_q] row into q (0 for padding); q_valid marks real rows
    q_valid: torch.Tensor
    q_pos: torch.Tensor  # [nb, max_q] absolute position of each query
    kv_tokens: torch.Tensor  # [nb, max_kv] token into the gathered K/V; padding -> the zero row
    kv_len: torch.Tensor  # [nb]
    first_key: int  # no query of the bucket sees a key before this one (sliding window)


_Q_TILE = 128  # causal requests are cut into query tiles of this many rows (see ``_pieces``)
# A bucket may pad (nb * max_q * max_kv vs the real sum of qo_len * kv_len) by at most this many
# logits (query-key pairs times qo heads): about what one more bucket's fixed cost would buy. On CPU
# (measured) any larger ratio-style allowance, such as 1.1x the real work, was slower.
_PAD_FREE = {"cpu": 1 << 14, "cuda": 1 << 22}


def _pieces(case: Case) -> list[tuple[int, int, int, int]]:
    """``(qo_len, kv_len, first q row, first kv token)`` of every request with queries.

    Under ``causal``, rows ``[a, b)`` of a request see only its first ``kv_len - qo_len + b`` keys,
    so each tile of ``_Q_TILE`` rows is a request of its own with that many keys (bottom-right
    alignment keeps every position; negative ``kv_len``: no row of the tile sees a key). This
    skips most of the masked triangle of long prefills.
    """
    layout, pieces, k_start = case.layout, [], 0
    for qo, kv, q_start in zip(layout.qo_lens, layout.kv_lens, layout.qo_indptr):
        tile = _Q_TILE if case.options.causal else max(qo, 1)
        pieces += [(min(tile, qo - a), kv - qo + min(a + tile, qo), q_start + a, k_start) for a in range(0, qo, tile)]
        k_start += kv
    return pieces


def _groups(pieces: list[tuple[int, int, int, int]], free: int) -> list[list[tuple[int, int, int, int]]]:
    """``pieces`` sorted by (qo_len, kv_len) and cut greedily into buckets that pad by at most
    ``free`` query-key pairs. Pieces of equal lengths go together, so the bucket shapes (hence
    every row's result) do not depend on the request order."""
    groups: list[list[tuple[int, int, int, int]]] = []
    real = longest = 0
    for (qo, kv), same in itertools.groupby(sorted(pieces), key=lambda piece: piece[:2]):
        same, kv = list(same), max(kv, 1)  # sorted: qo is the bucket's largest
        if groups:
            padded = (len(groups[-1]) + len(same)) * qo * max(longest, kv)
            if padded - (real + len(same) * qo * kv) <= free:
                groups[-1] += same
                real, longest = real + len(same) * qo * kv, max(longest, kv)
                continue
        groups.append(same)
        real, longest = len(same) * qo * kv, kv
    return groups


def _buckets(case: Case, device: torch.device) -> list[_Bucket]:
    window, zero_row = case.options.window_left, sum(case.layout.kv_lens)
    free = _PAD_FREE.get(device.type, _PAD_FREE["cpu"]) // case.heads.num_qo_heads
    buckets = []
    for group in _groups(_pieces(case), free):
        qo_len, kv_len, q_start, k_start = torch.tensor(group, device=device).T
        i = torch.arange(max(qo for qo, *_ in group), device=device)
        j = torch.arange(max(max(kv for _, kv, *_ in group), 1), device=device)
        q_valid = i[None, :] < qo_len[:, None]
        first_query = min(kv - qo for qo, kv, *_ in group)  # position of the bucket's earliest query
        buckets.append(
            _Bucket(
                q_rows=torch.where(q_valid, q_start[:, None] + i, 0),
                q_valid=q_valid,
                q_pos=(kv_len - qo_len)[:, None] + i,
                kv_tokens=torch.where(j[None, :] < kv_len[:, None], k_start[:, None] + j, zero_row),
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
    s = s.view(heads.num_kv_heads, bucket.q_rows.shape[0], heads.group_size, -1, s.shape[-1])
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


def _gather(x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Rows ``tokens`` [nb, n] of ``x`` [Hkv, T, D]: [Hkv, nb, n, D] (index_select: several times
    faster than advanced indexing on dim 1)."""
    return x.index_select(1, tokens.reshape(-1)).view(x.shape[0], *tokens.shape, x.shape[-1])


def _bucket_inputs(case: Case, bucket: _Bucket, q: torch.Tensor) -> torch.Tensor:
    """The bucket's queries as [Hkv, nb, G * max_q, D], zero in padded rows."""
    heads = case.heads
    qb = q[bucket.q_rows] * bucket.q_valid[..., None, None]
    qb = qb.view(*bucket.q_rows.shape, heads.num_kv_heads, heads.group_size, heads.head_dim_qk)
    return qb.permute(2, 0, 3, 1, 4).flatten(2, 3)


def _weigh(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``p`` [Hkv, nb, G, max_q, chunk] times ``v`` [Hkv, nb, chunk, D] -> [Hkv, nb, G, max_q, D]."""
    return torch.matmul(p.flatten(2, 3), v).view(*p.shape[:-1], v.shape[-1])


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
    keys, values = _heads_first_kv(case, tensors, dtype)
    q = tensors.q.to(dtype)
    buckets = _buckets(case, device)
    sink = _sink_logits(case, q)
    results = []
    for bucket in buckets:
        qb = _bucket_inputs(case, bucket, q)
        nb, max_q, max_kv = *bucket.q_rows.shape, bucket.kv_tokens.shape[1]
        heads = case.heads
        # float64 bytes per key column of a chunk: the logits, then the gathered K and V
        column = 8 * nb * (heads.num_qo_heads * max_q + heads.num_kv_heads * (heads.head_dim_qk + heads.head_dim_vo))
        step = chunk_size or max(1, _CHUNK_BYTES.get(device.type, _CHUNK_BYTES["cpu"]) // column)
        m = q.new_full((heads.num_kv_heads, nb, heads.group_size, max_q), float("-inf"))
        denom = torch.zeros_like(m)
        acc = q.new_zeros(*m.shape, heads.head_dim_vo)
        noise_v, noise_w = torch.zeros_like(acc), torch.zeros_like(m)
        for start in range(bucket.first_key, max_kv, step):  # earlier keys are outside every window
            cols = slice(start, min(start + step, max_kv))
            tokens = bucket.kv_tokens[:, cols]
            k, v = _gather(keys, tokens), _gather(values, tokens)
            s = _logits(case, bucket, qb, k, cols)
            m_new = torch.maximum(m, s.amax(-1))
            m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)  # all -inf so far: nothing to rescale
            if logit_noise:
                ulp = half_ulp(s, torch.float32)  # masked -inf gets a finite bound, and weight 0
            p = s.sub_(m_safe[..., None]).exp_()  # in place: s is not needed any more
            rescale = torch.exp(m - m_safe)
            denom = denom * rescale + p.sum(-1)
            acc = acc * rescale[..., None] + _weigh(p, v)
            if logit_noise:
                weighted = ulp.mul_(p)
                noise_v = noise_v * rescale[..., None] + _weigh(weighted, v.abs())
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
    keys, values = _heads_first_kv(case, tensors, dtype)
    q = tensors.q.to(dtype)
    if reorder_ops:
        q = q * case.sm_scale
        case = case.replace(options=dataclasses.replace(case.options, sm_scale=1.0))
    buckets = _buckets(case, q.device)
    sink = _sink_logits(case, q)
    results = []
    for bucket in buckets:
        max_kv = bucket.kv_tokens.shape[1]
        s = _logits(case, bucket, _bucket_inputs(case, bucket, q), _gather(keys, bucket.kv_tokens), slice(0, max_kv))
        if sink is not None:
            s = torch.cat([s, sink[..., None].expand(*s.shape[:-1], 1)], dim=-1)
        empty = torch.isinf(s.amax(-1)) if sink is None else torch.isinf(s[..., :-1].amax(-1))
        lse = torch.logsumexp(s[..., :max_kv], dim=-1)
        p = torch.softmax(torch.where(empty[..., None], 0.0, s), dim=-1).to(dtype)
        v = _gather(values, bucket.kv_tokens)
        if v.element_size() < 4:  # CPU BLAS multiplies 16-bit floats 4-8x faster with v laid out [D, kv]
            v = v.transpose(-1, -2).contiguous().transpose(-1, -2)
        out = _weigh(p[..., :max_kv], v)
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
