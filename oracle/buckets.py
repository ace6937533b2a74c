"""The host-side plan of ``pa_oracle.oracle.reference``: which rows are computed together, and every index
they need, built in numpy and moved to the compute device in one asynchronous copy.

Requests (causal ones cut into query tiles where that pays, see ``tiled``) are sorted by their
lengths and cut into buckets that pad little (``_groups``); each bucket is one batched computation.
The compute loop reads only host-side ints and arrays, so on CUDA it never waits on the stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import token_slots

# Causal requests are cut into query tiles of this many rows where that skips at least this
# fraction of their logits (see ``tiled``).
_Q_TILE = {"cpu": 128, "cuda": 512}
_TILE_MIN_SAVING = {"cpu": 0.0, "cuda": 1 / 8}
# A bucket may pad (nb * max_q * max_kv vs the real sum of qo_len * kv_len) by at most this many
# logits (query-key pairs times qo heads): about what one more bucket's fixed cost would buy. On CPU
# (measured) any larger ratio-style allowance, such as 1.1x the real work, was slower.
_PAD_FREE = {"cpu": 1 << 14, "cuda": 1 << 22}
# ... where each padded key (nb * max_kv vs the sum of kv_len) also counts as this many logits per
# element of its gathered K and V (Hkv * (Dqk + Dvo)). On CUDA a gathered float64 element is written,
# read back and read by the matmul, about half the passes of a logit (matmul, max, softmax, matmul):
# a decode bucket, one query per request, pads little in logits but, at 32/8 heads of dim 128,
# 64x as much in K/V. Unmeasured on CPU, where it is left out (the CPU budget above is tuned without it).
_KV_PAD_WEIGHT = {"cpu": 0.0, "cuda": 0.5}


@dataclass(frozen=True)
class Bucket:
    """Pieces (requests, or query tiles of causal ones) padded to ``max_q`` queries and ``max_kv``
    keys. Row ``i`` of piece ``b`` attends its keys ``first[b, i] <= j <= last[b, i]`` (key columns
    count from the piece's first key). Padded rows read the zero query and mask nothing, so they
    stay finite; they are dropped when the results are written back (``src``/``dst``). Padded keys
    read the zero token and lie past ``last`` of every real row.

    A bucket of one piece with keys (``contiguous``) has no padding: its queries and keys are
    ranges of the flat q and of the logical KV, read as views, so it has no index tensors.

    The tensors live on the compute device; everything else is host-side, so the loop never waits.
    """

    nb: int
    max_q: int
    max_kv: int
    contiguous: tuple[int, int] | None  # (first q row, first kv token) of a lone piece; else None
    q_rows: torch.Tensor | None  # [nb, max_q] row into the zero-padded q; padding -> the zero row
    kv_tokens: torch.Tensor | None  # [nb, max_kv] token into the logical KV; padding -> the zero token
    src: torch.Tensor | None  # [n] flat (piece, row) index of every real row ...
    dst: torch.Tensor | None  # [n] ... and its row in the output
    q_pos: torch.Tensor  # [nb, max_q] absolute position of each query (ALiBi)
    first: torch.Tensor  # [nb, max_q] first key column attended (sliding window; else 0)
    last: torch.Tensor  # [nb, max_q] last key column attended (causal: the position; else kv_len - 1)
    row_first: np.ndarray  # ``first`` and ``last`` of the real rows, on the host: which rows of
    row_last: np.ndarray  # a chunk of key columns can have no key at all, which masks must run
    first_key: int  # no real row attends a key before this one: those columns are never computed
    masked: tuple[tuple[int, int], ...]  # key column ranges [a, b) where some real row masks a key

    def has_empty_rows(self, a: int, b: int) -> bool:
        """Whether some row attends no key among columns ``[a, b)`` (padded rows attend all)."""
        return bool((np.maximum(self.row_first, a) > np.minimum(self.row_last, b - 1)).any())

    def mask_sides(self, a: int, b: int) -> tuple[bool, bool]:
        """Within columns ``[a, b)``: does some real row mask keys left of its ``first``, and
        does some real row mask keys right of its ``last``."""
        return a < int(self.row_first.max()), b - 1 > int(self.row_last.min())


class Plan(NamedTuple):
    buckets: list[Bucket]
    slots: torch.Tensor  # [total_kv] flat pool slot (page * page_size + slot) of every key token
    max_kv: int  # the widest bucket's key columns
    empty_rows: bool = True  # whether some query row attends no key (its out is 0, its LSE -inf), known on the host


class _Pieces(NamedTuple):
    """One entry per piece, int64: its queries, its keys, its first q row and its first kv token
    (a causal tile sees the first ``kv`` keys of its request; ``kv`` may be <= 0)."""

    qo: np.ndarray
    kv: np.ndarray
    q_start: np.ndarray
    k_start: np.ndarray


def tiled(qo_len: np.ndarray, kv_len: np.ndarray, device: str) -> np.ndarray:
    """Which causal requests are cut into query tiles of ``_Q_TILE[device]`` rows.

    Tiles skip the masked triangle but for its diagonal tiles: ``(qo_len - tile) / (2 kv_len)``
    of the request's ``qo_len * kv_len`` logits. The price is a bucket (a dozen launches) per
    tile, and tiles that share a bucket pad each other and gather their keys, while a request
    alone in its bucket reads them as a view. On CPU, 128-row tiles were 1.4-5.4x faster than
    whole requests from 512x4096 to 4096x4096 (8/2 heads, dim 64; cache-sized chunks) but for
    one shape within noise (1024x4096: 0.9x), so any request of two tiles or more is cut. On
    CUDA the tiles are 512 rows, so that they rarely share a bucket, and a request is cut only
    where that skips at least 1/8 of its logits: a serving prefill chunk of 512 queries over 4k
    keys stays whole. ``benchmarks/oracle_speed.py --tiling`` measures both choices.
    """
    tile = _Q_TILE.get(device, _Q_TILE["cpu"])
    saving = (qo_len - tile) / (2 * np.maximum(kv_len, 1))
    return (qo_len > tile) & (saving >= _TILE_MIN_SAVING.get(device, _TILE_MIN_SAVING["cpu"]))


def _pieces(case: Case, device: str) -> _Pieces:
    """The pieces of every request with queries: the request, or under ``causal`` where ``tiled``
    says so its query tiles. Rows ``[a, b)`` of a causal request see only its first
    ``kv_len - qo_len + b`` keys, so each tile is a request of its own with that many keys
    (bottom-right alignment keeps every position)."""
    layout, tile = case.layout, _Q_TILE.get(device, _Q_TILE["cpu"])
    qo = np.asarray(layout.qo_lens, dtype=np.int64)
    kv = np.asarray(layout.kv_lens, dtype=np.int64)
    q_start = np.asarray(layout.qo_indptr[:-1], dtype=np.int64)
    k_start = np.cumsum(kv) - kv
    has_q = qo > 0
    qo, kv, q_start, k_start = qo[has_q], kv[has_q], q_start[has_q], k_start[has_q]
    cut = tiled(qo, kv, device) if case.options.causal else np.zeros(len(qo), dtype=bool)
    n_tiles = np.where(cut, -(-qo // tile), 1)
    owner = np.repeat(np.arange(len(qo)), n_tiles)
    offset = (np.arange(len(owner)) - np.repeat(np.cumsum(n_tiles) - n_tiles, n_tiles)) * tile  # 0 if uncut
    rows = np.where(cut[owner], np.minimum(tile, qo[owner] - offset), qo[owner])
    return _Pieces(rows, kv[owner] - qo[owner] + offset + rows, q_start[owner] + offset, k_start[owner])


def _groups(pieces: _Pieces, free: float, qo_heads: int, key_width: float) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The pieces sorted by (qo_len, kv_len, q_start, k_start), and the ``[start, end)`` runs of
    that order that form buckets, cut greedily so that each pads by at most ``free``: padded
    query-key pairs times ``qo_heads`` plus padded keys times ``key_width``. Pieces of equal lengths
    go together, so the bucket shapes (hence every row's result) do not depend on the request order."""
    order = np.lexsort((pieces.k_start, pieces.q_start, pieces.kv, pieces.qo))
    if len(order) == 0:
        return order, []
    qo, kv = pieces.qo[order], pieces.kv[order]
    starts = [0, *(np.flatnonzero((np.diff(qo) != 0) | (np.diff(kv) != 0)) + 1).tolist()]
    groups: list[tuple[int, int]] = []
    pairs = keys = longest = 0  # of the last group: real query-key pairs, real keys, longest kv
    for start, end in zip(starts, [*starts[1:], len(order)]):
        n, q, k = end - start, int(qo[start]), max(int(kv[start]), 1)  # sorted: q is the bucket's largest
        if groups:
            nb, widest = groups[-1][1] - groups[-1][0] + n, max(longest, k)
            padding = (nb * q * widest - pairs - n * q * k) * qo_heads + (nb * widest - keys - n * k) * key_width
            if padding <= free:
                groups[-1] = (groups[-1][0], end)
                pairs, keys, longest = pairs + n * q * k, keys + n * k, widest
                continue
        groups.append((start, end))
        pairs, keys, longest = n * q * k, n * k, k
    return order, groups


def _masked_ranges(first_key: int, max_kv: int, left_end: int, right_start: int) -> tuple[tuple[int, int], ...]:
    """Key columns ``[0, left_end)`` and ``[right_start, max_kv)`` hold every masked key of a real
    row; columns before ``first_key`` are never computed. One range if the two meet."""
    left_end = min(max(left_end, first_key), max_kv)
    right_start = max(min(right_start, max_kv), first_key)
    if right_start <= left_end:
        return ((first_key, max_kv),) if first_key < max_kv else ()
    return tuple((a, b) for a, b in ((first_key, left_end), (right_start, max_kv)) if a < b)


class _HostBucket(NamedTuple):
    """A ``Bucket``'s host fields, and its tensor fields as host arrays (by field name)."""

    nb: int
    max_q: int
    max_kv: int
    contiguous: tuple[int, int] | None
    row_first: np.ndarray
    row_last: np.ndarray
    first_key: int
    masked: tuple[tuple[int, int], ...]
    arrays: dict[str, np.ndarray]


def _bucket_on_host(case: Case, qo: np.ndarray, kv: np.ndarray, q_start: np.ndarray, k_start: np.ndarray) -> _HostBucket | None:
    """One bucket's host fields and index arrays; None if none of its rows attends any key (its
    rows keep the output's initial out 0, lse -inf)."""
    window, causal = case.options.window_left, case.options.causal
    nb, max_q, max_kv = len(qo), int(qo.max()), max(int(kv.max()), 1)
    i = np.arange(max_q)
    real = i < qo[:, None]
    q_pos = (kv - qo)[:, None] + i
    first = q_pos - window if window >= 0 else np.zeros_like(q_pos)
    last = q_pos if causal else np.broadcast_to((kv - 1)[:, None], q_pos.shape)
    row_first, row_last = first[real], last[real]
    if (np.maximum(row_first, 0) > row_last).all():
        return None
    arrays = {
        "q_pos": q_pos,
        "first": np.where(real, first, 0),  # padded rows mask nothing
        "last": np.where(real, last, max_kv - 1),
    }
    contiguous = None
    if nb == 1:  # one piece: no padded row, and kv >= 1 (else every row is empty)
        contiguous = (int(q_start[0]), int(k_start[0]))
    else:
        j = np.arange(max_kv)
        arrays["q_rows"] = np.where(real, q_start[:, None] + i, case.layout.total_q)
        kv_tokens = np.add.outer(k_start, j)  # the largest array of a plan: filled in place
        np.putmask(kv_tokens, j >= kv[:, None], sum(case.layout.kv_lens))
        arrays["kv_tokens"] = kv_tokens
        arrays["src"] = np.flatnonzero(real)
        arrays["dst"] = (q_start[:, None] + i)[real]
    first_key = max(0, int(row_first.min()))
    masked = _masked_ranges(first_key, max_kv, int(row_first.max()), int(row_last.min()) + 1)
    return _HostBucket(nb, max_q, max_kv, contiguous, row_first, row_last, first_key, masked, arrays)


def _to_device(arrays: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """int64 host arrays on ``device`` in one copy: on CUDA the launches and waits, not the bytes,
    were the cost. The copy is from pinned memory (a copy from pageable memory synchronizes the
    stream), written by numpy straight into the pinned buffer."""
    if device.type == "cpu":
        return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
    sizes = [a.size for a in arrays]
    host = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=device.type == "cuda")
    np.concatenate([a.reshape(-1) for a in arrays], out=host.numpy())
    flat = host.to(device, non_blocking=True)
    return [part.view(a.shape) for part, a in zip(flat.split(sizes), arrays)]


class HostPlan(NamedTuple):
    """``plan_buckets``' host half (numpy only, no device)."""

    device_type: str  # the device type it was planned for (the padding budget differs)
    buckets: list[_HostBucket]
    arrays: list[np.ndarray]  # ``token_slots``, then each bucket's arrays in order
    empty_rows: bool


def host_plan(case: Case, device_type: str) -> HostPlan:
    """The bucket plan of ``case`` for a ``device_type`` device, on the host."""
    heads, kind = case.heads, device_type if device_type in _PAD_FREE else "cpu"
    key_width = _KV_PAD_WEIGHT[kind] * heads.num_kv_heads * (heads.head_dim_qk + heads.head_dim_vo)
    pieces = _pieces(case, device_type)
    order, groups = _groups(pieces, _PAD_FREE[kind], heads.num_qo_heads, key_width)
    sorted_pieces = [field[order] for field in pieces]
    host = [hb for a, b in groups if (hb := _bucket_on_host(case, *(f[a:b] for f in sorted_pieces))) is not None]
    arrays = [token_slots(case)] + [a for hb in host for a in hb.arrays.values()]
    rows_with_keys = sum(int((np.maximum(hb.row_first, 0) <= hb.row_last).sum()) for hb in host)
    return HostPlan(device_type, host, arrays, rows_with_keys < case.layout.total_q)


def plan_buckets(case: Case, device: torch.device) -> Plan:
    """Every index of the call, built on the host (``host_plan``) and moved to ``device`` at once."""
    host = host_plan(case, device.type)
    slots, *moved = _to_device(host.arrays, device)
    buckets, at = [], 0
    for hb in host.buckets:
        tensors = dict(zip(hb.arrays, moved[at : at + len(hb.arrays)]))
        at += len(hb.arrays)
        buckets.append(Bucket(
            nb=hb.nb, max_q=hb.max_q, max_kv=hb.max_kv, contiguous=hb.contiguous,
            q_rows=tensors.get("q_rows"), kv_tokens=tensors.get("kv_tokens"), src=tensors.get("src"), dst=tensors.get("dst"),
            q_pos=tensors["q_pos"], first=tensors["first"], last=tensors["last"],
            row_first=hb.row_first, row_last=hb.row_last, first_key=hb.first_key, masked=hb.masked,
        ))
    return Plan(buckets, slots, max((b.max_kv for b in buckets), default=0), host.empty_rows)
