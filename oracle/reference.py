"""The float64 reference paged attention, and the plain same-precision control.

``reference`` follows ``oracle.case`` exactly. It is vectorized over the batch: requests (causal
ones cut into query tiles, see ``_pieces``) are bucketed by similar lengths so that padding stays
small (``_groups``), each bucket is one batched computation over chunks of keys (one chunk unless
the context is long), and the chunks' softmax states are merged, so memory stays bounded. It runs
wherever the tensors are (CPU or CUDA).

On CUDA the cost was the host, not the arithmetic: launches and stream syncs. So every index of
every bucket is built on the host and moved in one asynchronous copy (``_plan``), the loop reads
only host-side ints (no ``.item()``, no boolean-mask indexing, which syncs), masking touches only
the key columns that can hold a masked key, and each chunk's softmax is one fused kernel.

>>> from oracle.case import Case, Layout, Heads
>>> case = Case(Layout.from_lengths([1], [3], page_size=2), Heads(1, 1, 4, 4))
>>> ref = reference(case, make_tensors(case))
>>> tuple(ref.out.shape), ref.out.dtype
((1, 1, 4), torch.float64)
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from oracle.case import Case
from oracle.tensors import Tensors, make_tensors, token_addresses

LOG2_E = 1.0 / math.log(2.0)
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


def _heads_first_kv(case: Case, tensors: Tensors, dtype: torch.dtype, slots: torch.Tensor) -> list[torch.Tensor]:
    """``gather_kv`` as [Hkv, total_kv + 1, D]: heads first, so that ``_gather`` gives matmul-ready
    [Hkv, nb, n, D]; the extra zero token is the target of every padded index. ``slots`` [total_kv]
    is each token's flat slot in the pool (``_Plan.slots``)."""
    opts, out = case.options, []
    for cache, scale in ((tensors.k_cache, opts.k_scale), (tensors.v_cache, opts.v_scale)):
        stored = cache.flatten(0, 1).index_select(0, slots)
        x = stored.new_empty(stored.shape[1], stored.shape[0] + 1, stored.shape[2], dtype=dtype)
        x[:, :-1], x[:, -1] = stored.transpose(0, 1), 0  # converts and transposes in one pass
        out.append(x.mul_(scale) if opts.is_fp8 else x)
    return out


@dataclass(frozen=True)
class _Bucket:
    """Pieces (requests, or query tiles of causal ones) padded to ``max_q`` queries and ``max_kv``
    keys. Row ``i`` of piece ``b`` attends its keys ``first[b, i] <= j <= last[b, i]`` (key columns
    count from the piece's first key). Padded rows read the zero query and mask nothing, so they
    stay finite; they are dropped when the results are written back (``src``/``dst``). Padded keys
    read the zero token and lie past ``last`` of every real row.

    The tensors live on the compute device; the ints are host-side, so the loop never waits on it.
    """

    q_rows: torch.Tensor  # [nb, max_q] row into the zero-padded q; padding -> the zero row
    q_pos: torch.Tensor  # [nb, max_q] absolute position of each query (ALiBi)
    first: torch.Tensor  # [nb, max_q] first key column attended (sliding window; else 0)
    last: torch.Tensor  # [nb, max_q] last key column attended (causal: the position; else kv_len - 1)
    kv_tokens: torch.Tensor  # [nb, max_kv] token into the gathered K/V; padding -> the zero token
    src: torch.Tensor  # [n] flat (piece, row) index of every real row ...
    dst: torch.Tensor  # [n] ... and its row in the output
    first_key: int  # no real row attends a key before this one: those columns are never computed
    masked: tuple[tuple[int, int], ...]  # key column ranges [a, b) where some real row masks a key


class _Plan(NamedTuple):
    buckets: list[_Bucket]
    slots: torch.Tensor  # [total_kv] flat pool slot (page * page_size + slot) of every key token


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


def _masked_ranges(first_key: int, max_kv: int, left_end: int, right_start: int) -> tuple[tuple[int, int], ...]:
    """Key columns ``[0, left_end)`` and ``[right_start, max_kv)`` hold every masked key of a real
    row; columns before ``first_key`` are never computed. One range if the two meet."""
    left_end = min(max(left_end, first_key), max_kv)
    right_start = max(min(right_start, max_kv), first_key)
    if right_start <= left_end:
        return ((first_key, max_kv),) if first_key < max_kv else ()
    return tuple((a, b) for a, b in ((first_key, left_end), (right_start, max_kv)) if a < b)


def _bucket_on_host(case: Case, group: list[tuple[int, int, int, int]]) -> tuple[list[torch.Tensor], int, tuple]:
    """The index tensors of one bucket (``_Bucket`` field order, on the CPU) and its host ints."""
    window, causal = case.options.window_left, case.options.causal
    total_q, total_kv = case.layout.total_q, sum(case.layout.kv_lens)
    qo_len, kv_len, q_start, k_start = torch.tensor(group, dtype=torch.long).T
    i = torch.arange(max(qo for qo, *_ in group))
    j = torch.arange(max(max(kv for _, kv, *_ in group), 1))
    real = i[None, :] < qo_len[:, None]
    q_pos = (kv_len - qo_len)[:, None] + i
    first = q_pos - window if window >= 0 else torch.zeros_like(q_pos)
    last = q_pos if causal else (kv_len - 1)[:, None].expand_as(q_pos)
    first, last = torch.where(real, first, 0), torch.where(real, last, len(j) - 1)  # padded rows mask nothing
    fields = [
        torch.where(real, q_start[:, None] + i, total_q),  # q_rows
        q_pos,
        first,
        last,
        torch.where(j[None, :] < kv_len[:, None], k_start[:, None] + j, total_kv),  # kv_tokens
        real.flatten().nonzero().flatten(),  # src
        (q_start[:, None] + i)[real],  # dst
    ]
    first_key = max(0, int(first[real].min()))
    masked = _masked_ranges(first_key, len(j), int(first[real].max()), int(last[real].min()) + 1)
    return fields, first_key, masked


def _upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on ``device`` without waiting: a plain copy from pageable memory synchronizes
    the CUDA stream, one from pinned memory does not."""
    if device.type == "cpu":
        return host
    return (host.pin_memory() if device.type == "cuda" else host).to(device, non_blocking=True)


def _to_device(host: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """CPU int64 tensors on ``device`` in one copy instead of one blocking copy each: on CUDA the
    waits and launches, not the bytes, were the cost."""
    if device.type == "cpu":
        return host
    flat = _upload(torch.cat([t.reshape(-1) for t in host]), device)
    return [part.view(t.shape) for part, t in zip(flat.split([t.numel() for t in host]), host)]


def _plan(case: Case, device: torch.device) -> _Plan:
    """Every index of the call, built on the host and moved to ``device`` at once."""
    free = _PAD_FREE.get(device.type, _PAD_FREE["cpu"]) // case.heads.num_qo_heads
    pages, slots = token_addresses(case)
    host, ints = [pages * case.layout.page_size + slots], []
    for group in _groups(_pieces(case), free):
        fields, first_key, masked = _bucket_on_host(case, group)
        host += fields
        ints.append((first_key, masked))
    slots, *moved = _to_device(host, device)
    per = len(moved) // max(len(ints), 1)  # index tensors per bucket
    buckets = [_Bucket(*moved[n * per : (n + 1) * per], *ints[n]) for n in range(len(ints))]  # type: ignore[arg-type, call-arg]
    return _Plan(buckets, slots)


def _logits(
    case: Case, bucket: _Bucket, q: torch.Tensor, k: torch.Tensor, cols: slice, scale: float, alibi: torch.Tensor | None
) -> torch.Tensor:
    """Masked logits ``scale * q.k`` [Hkv, nb, G, max_q, chunk] for key columns ``cols``; masked keys
    are -inf. ``q`` is [Hkv, nb, G * max_q, D] and ``k`` [Hkv, nb, chunk, D], in the compute dtype;
    ``alibi`` the slopes as [Hkv, 1, G, 1, 1].

    Masking touches only the columns of ``bucket.masked`` (a decode bucket: the padded tail; a
    causal tile: its last ``_Q_TILE`` or so columns), not the whole chunk.
    """
    opts, heads = case.options, case.heads
    s = torch.matmul(q, k.transpose(-1, -2))
    if scale != 1.0:
        s.mul_(scale)
    s = s.view(heads.num_kv_heads, bucket.q_rows.shape[0], heads.group_size, -1, s.shape[-1])
    if opts.logits_soft_cap > 0:
        s = s.div_(opts.logits_soft_cap).tanh_().mul_(opts.logits_soft_cap)
    if alibi is not None:
        k_pos = torch.arange(cols.start, cols.stop, device=s.device)
        distance = (bucket.q_pos[:, :, None] - k_pos).abs().to(s.dtype)  # [nb, max_q, chunk]
        s.addcmul_(alibi, distance[None, :, None], value=-1.0)
    for a, b in bucket.masked:
        a, b = max(a, cols.start), min(b, cols.stop)
        if a < b:
            j = torch.arange(a, b, device=s.device)
            drop = (j < bucket.first[:, :, None]) | (j > bucket.last[:, :, None])  # [nb, max_q, b - a]
            s[..., a - cols.start : b - cols.start].masked_fill_(drop[None, :, None], float("-inf"))
    return s


def _gather(x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Rows ``tokens`` [nb, n] of ``x`` [Hkv, T, D]: [Hkv, nb, n, D] (index_select: several times
    faster than advanced indexing on dim 1)."""
    return x.index_select(1, tokens.reshape(-1)).view(x.shape[0], *tokens.shape, x.shape[-1])


def _padded_q(tensors: Tensors, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """``scale * q`` in ``dtype`` with a zero row appended (the target of padded query rows)."""
    q = tensors.q.new_zeros(tensors.q.shape[0] + 1, *tensors.q.shape[1:], dtype=dtype)
    q[:-1] = tensors.q
    return q.mul_(scale) if scale != 1.0 else q


def _bucket_inputs(case: Case, bucket: _Bucket, q: torch.Tensor) -> torch.Tensor:
    """The bucket's queries as [Hkv, nb, G * max_q, D] (``q`` from ``_padded_q``)."""
    heads = case.heads
    qb = q.index_select(0, bucket.q_rows.flatten())
    qb = qb.view(*bucket.q_rows.shape, heads.num_kv_heads, heads.group_size, heads.head_dim_qk)
    return qb.permute(2, 0, 3, 1, 4).flatten(2, 3)


def _weigh(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``p`` [Hkv, nb, G, max_q, chunk] times ``v`` [Hkv, nb, chunk, D] -> [Hkv, nb, G, max_q, D]."""
    return torch.matmul(p.flatten(2, 3), v).view(*p.shape[:-1], v.shape[-1])


def _put_rows(dest: torch.Tensor, bucket: _Bucket, x: torch.Tensor) -> None:
    """Write a bucket result ``x`` [Hkv, nb, G, max_q, ...] into the flat rows of ``dest``
    [total_q, Hq, ...]; padded rows are dropped."""
    rows = x.permute(1, 3, 0, 2, *range(4, x.dim())).flatten(0, 1).flatten(1, 2)  # [nb * max_q, Hq, ...]
    dest.index_copy_(0, bucket.dst, rows.index_select(0, bucket.src))


def _per_head(case: Case, values: tuple[float, ...] | None, like: torch.Tensor) -> torch.Tensor | None:
    """Per-qo-head constants (sinks, ALiBi slopes) as [Hkv, 1, G, 1] in ``like``'s dtype and device."""
    if values is None:
        return None
    h = case.heads
    return _upload(torch.tensor(values, dtype=like.dtype), like.device).view(h.num_kv_heads, 1, h.group_size, 1)


class _State(NamedTuple):
    """Attention of some rows over a subset of their keys: the LSE of their logits and the
    softmax-weighted averages of V (and of the ``logit_noise`` terms) over those keys alone."""

    lse: torch.Tensor  # [...]; -inf where the subset holds no attended key
    out: torch.Tensor  # [..., Dvo]; 0 where lse is -inf
    noise_v: torch.Tensor | None  # [..., Dvo] average of half_ulp32(s_j) * |v_j|
    noise_w: torch.Tensor | None  # [...] average of half_ulp32(s_j)


def _attend(s: torch.Tensor, v: torch.Tensor, logit_noise: bool) -> _State:
    """The state of masked logits ``s`` [..., chunk] over values ``v``.

    One fused softmax instead of separate max / subtract / exp / sum passes over the logits: its
    value at a row's largest logit ``m`` is ``exp(0) / sum_j exp(s_j - m)``, so the row's LSE is
    ``m - log`` of it (exact to an ulp or two of float64).
    """
    m, at = s.max(-1, keepdim=True)
    empty = torch.isneginf(m).squeeze(-1)  # every key masked: the softmax row is NaN
    p = torch.softmax(s, -1)
    lse = torch.where(empty, float("-inf"), (m - torch.log(p.gather(-1, at))).squeeze(-1))
    out = torch.where(empty[..., None], 0.0, _weigh(p, v))
    if not logit_noise:
        return _State(lse, out, None, None)
    weighted = half_ulp(s, torch.float32).mul_(p)  # masked -inf gets a finite bound, and weight 0
    noise_v = torch.where(empty[..., None], 0.0, _weigh(weighted, v.abs()))
    return _State(lse, out, noise_v, torch.where(empty, 0.0, weighted.sum(-1)))


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
    to attend give out 0 and lse -inf. ``sm_scale`` multiplies q before the dot products (one pass
    over q instead of one over the logits): that moves each logit by about an ulp of float64.

    Each bucket is computed over chunks of at most ``chunk_size`` key columns (default: sized to
    memory); each chunk is attended alone (``_attend``) and the chunk states are merged
    (``_merge``), the split-KV identity the tests check against ``merge_states``.

    ``logit_noise=True`` also returns, per output element, a first-order bound on the error that
    rounding each logit to float32 (every kernel's accumulator) causes:
    ``sum_j p_j * half_ulp32(s_j) * (|v_j| + |out|)``. It is large exactly where softmax is
    peaked on large logits, where any correct fp32 kernel loses digits.
    """
    if lse_base not in ("e", "2"):
        raise ValueError(f"lse_base must be 'e' or '2', got {lse_base!r}")
    dtype, device, heads = torch.float64, tensors.q.device, case.heads
    plan = _plan(case, device)
    keys, values = _heads_first_kv(case, tensors, dtype, plan.slots)
    q = _padded_q(tensors, dtype, case.sm_scale)
    sink = _per_head(case, case.options.sinks, q)
    alibi = _per_head(case, case.options.alibi_slopes, q)
    alibi = None if alibi is None else alibi[..., None]
    out = q.new_zeros(case.layout.total_q, heads.num_qo_heads, heads.head_dim_vo)
    lse = q.new_full(out.shape[:2], float("-inf"))
    noise = torch.zeros_like(out) if logit_noise else None
    for bucket in plan.buckets:
        qb = _bucket_inputs(case, bucket, q)
        nb, max_kv = bucket.q_rows.shape[0], bucket.kv_tokens.shape[1]
        # float64 bytes per key column of a chunk: the logits and their softmax, the gathered K and V
        column = 8 * nb * (2 * heads.num_qo_heads * bucket.q_rows.shape[1] + heads.num_kv_heads * (heads.head_dim_qk + heads.head_dim_vo))
        step = chunk_size or max(1, _CHUNK_BYTES.get(device.type, _CHUNK_BYTES["cpu"]) // column)
        state = None
        for start in range(bucket.first_key, max_kv, step):  # earlier keys are outside every window
            cols = slice(start, min(start + step, max_kv))
            tokens = bucket.kv_tokens[:, cols]
            s = _logits(case, bucket, qb, _gather(keys, tokens), cols, 1.0, alibi)
            part = _attend(s, _gather(values, tokens), logit_noise)
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


def plain_attention(
    case: Case, tensors: Tensors, dtype: torch.dtype, *, reorder_ops: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The naive computation every step in ``dtype``: logits, softmax, cast, matmul.

    This is the *control* of the tolerance model (flash-attn's ``attention_ref(upcast=False)``):
    a kernel in ``dtype`` may be as far from the float64 reference as this is, times a factor.
    ``reorder_ops`` scales q before the dot product instead of the logits after it (flash-attn's
    second control): the same precision, rounded differently.
    """
    heads = case.heads
    plan = _plan(case, tensors.q.device)
    keys, values = _heads_first_kv(case, tensors, dtype, plan.slots)
    q = _padded_q(tensors, dtype, case.sm_scale if reorder_ops else 1.0)
    logit_scale = 1.0 if reorder_ops else case.sm_scale
    sink = _per_head(case, case.options.sinks, q)
    alibi = _per_head(case, case.options.alibi_slopes, q)
    alibi = None if alibi is None else alibi[..., None]
    out = q.new_zeros(case.layout.total_q, heads.num_qo_heads, heads.head_dim_vo)
    lse = q.new_full(out.shape[:2], float("-inf"))
    for bucket in plan.buckets:
        cols = slice(bucket.first_key, bucket.kv_tokens.shape[1])  # earlier keys are outside every window
        tokens = bucket.kv_tokens[:, cols]
        s = _logits(case, bucket, _bucket_inputs(case, bucket, q), _gather(keys, tokens), cols, logit_scale, alibi)
        n_keys = s.shape[-1]
        if sink is not None:
            s = torch.cat([s, sink[..., None].expand(*s.shape[:-1], 1)], dim=-1)
        empty = torch.isinf(s.amax(-1)) if sink is None else torch.isinf(s[..., :-1].amax(-1))
        bucket_lse = torch.logsumexp(s[..., :n_keys], dim=-1)
        p = torch.softmax(torch.where(empty[..., None], 0.0, s), dim=-1).to(dtype)
        v = _gather(values, tokens)
        if v.element_size() < 4:  # CPU BLAS multiplies 16-bit floats 4-8x faster with v laid out [D, kv]
            v = v.transpose(-1, -2).contiguous().transpose(-1, -2)
        bucket_out = _weigh(p[..., :n_keys], v)
        _put_rows(out, bucket, torch.where(empty[..., None], 0.0, bucket_out))
        _put_rows(lse, bucket, torch.where(empty, float("-inf"), bucket_lse))
    return out, lse


def merge_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial attention states over disjoint key sets (natural-log LSE).

    Two empty states (both LSE -inf) merge to out 0, LSE -inf, never NaN.
    """
    state = _merge(_State(lse_a, out_a, None, None), _State(lse_b, out_b, None, None))
    return state.out, state.lse

__all__ = ["Reference", "half_ulp", "reference", "plain_attention", "merge_states", "gather_kv", "make_tensors", "LOG2_E"]
