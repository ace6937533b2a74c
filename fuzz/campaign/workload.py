"""A case together with how its tensors are made, so that a reduction keeps data and layout
consistent: a seed-generated case is regenerated from its seed after every change; an
explicit-tensor case (npz sidecar) keeps the values of every surviving token, query row, head
and dimension (``TokenData``) and is re-packed into a fresh pool, every unreferenced slot poison.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pa_oracle.fuzz.campaign.finding_record import FindingMeta, GeneratedFrom
from pa_oracle.oracle.case import Case, Heads, Layout
from pa_oracle.oracle.tensors import POISON, Tensors, make_tensors, save_tensors, token_addresses, torch_dtype


@dataclass(frozen=True)
class TokenData:
    """Explicit values by logical token: ``q`` [total_q, Hq, Dqk] (q dtype); ``k`` / ``v`` one
    [kv_len, Hkv, D] tensor per request, as stored in the cache (kv dtype, before k/v_scale)."""

    q: torch.Tensor
    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]

    def digest(self) -> str:
        h = hashlib.sha256()
        for t in (self.q, *self.k, *self.v):
            h.update(str((tuple(t.shape), t.dtype)).encode())
            h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:16]


@dataclass(frozen=True)
class Workload:
    """``case`` (its ``tensors_file`` is always None here) and its data: ``None`` means the
    tensors come from ``case.seed`` and ``case.distribution``."""

    case: Case
    data: TokenData | None = None

    @classmethod
    def from_case(cls, case: Case) -> Workload:
        if case.tensors_file is None:
            return cls(case)
        tensors = make_tensors(case, "cpu")
        pages, slots = token_addresses(case)
        lens = list(case.layout.kv_lens)
        k = tuple(tensors.k_cache[pages, slots].split(lens))
        v = tuple(tensors.v_cache[pages, slots].split(lens))
        return cls(case.replace(tensors_file=None), TokenData(tensors.q, k, v))

    @property
    def explicit(self) -> bool:
        return self.data is not None

    def key(self) -> str:
        """Identifies the workload: same key, same kernel inputs."""
        return self.case.case_id + (f"+{self.data.digest()}" if self.data is not None else "")

    def tensors(self) -> Tensors:
        if self.data is None:
            return make_tensors(self.case, "cpu")
        lay, heads, opts = self.case.layout, self.case.heads, self.case.options
        pages, slots = token_addresses(self.case)
        caches = []
        for stored, dim in ((self.data.k, heads.head_dim_qk), (self.data.v, heads.head_dim_vo)):
            pool = torch.full((lay.num_pages, lay.page_size, heads.num_kv_heads, dim), POISON)
            pool = pool.to(torch_dtype(opts.kv_dtype))
            pool[pages, slots] = torch.cat(stored)
            caches.append(pool)
        return Tensors(self.data.q.clone(), caches[0], caches[1])

    def materialize(self, folder: Path) -> Case:
        """The case ``check_case`` can run: explicit data goes to an npz sidecar in ``folder``."""
        if self.data is None:
            return self.case
        path = Path(folder) / f"{self.key().replace('+', '-')}.npz"
        if not path.exists():
            save_tensors(self.tensors(), path)
        return self.case.replace(tensors_file=str(path))

    def save(self, folder: Path, meta: FindingMeta) -> Path:
        """Write ``case.json`` + ``tensors.npz`` (as ``save_finding`` does) with ``meta`` (the seed it was drawn
        from added when the tensors are the seed's); return the json path."""
        folder = Path(folder)
        save_tensors(self.tensors(), folder / "tensors.npz")
        if self.data is None:
            meta = meta.seen(generated_from=GeneratedFrom(self.case.seed, self.case.distribution))
        return self.case.replace(tensors_file="tensors.npz", meta=meta.to_json()).save(folder / "case.json")


# --- reductions: each returns a new Workload or raises CaseError (an invalid candidate) ---------


def _layout(
    qo_lens: Sequence[int], kv_lens: Sequence[int], pages: Sequence[Sequence[int]], page_size: int, num_pages: int
) -> Layout:
    """A layout from per-request lengths and page lists (each list at least as long as needed)."""
    qo_indptr, kv_indptr, kv_indices, last = [0], [0], [], []
    for qo, kv, own in zip(qo_lens, kv_lens, pages):
        need = -(-kv // page_size)
        kv_indices += list(own[:need])
        kv_indptr.append(len(kv_indices))
        qo_indptr.append(qo_indptr[-1] + qo)
        last.append(0 if kv == 0 else (kv - 1) % page_size + 1)
    return Layout(tuple(qo_indptr), tuple(kv_indptr), tuple(kv_indices), tuple(last), page_size, num_pages)


def keep_requests(work: Workload, keep: Sequence[int]) -> Workload:
    """Only the requests ``keep`` (in that order), each on its own pages; the pool is unchanged."""
    lay = work.case.layout
    layout = _layout(
        [lay.qo_lens[b] for b in keep], [lay.kv_lens[b] for b in keep], [lay.pages_of(b) for b in keep],
        lay.page_size, lay.num_pages,
    )
    data = None
    if work.data is not None:
        rows = [torch.arange(lay.qo_indptr[b], lay.qo_indptr[b + 1]) for b in keep]
        q = work.data.q[torch.cat(rows).long()] if rows else work.data.q[:0]
        data = TokenData(q, tuple(work.data.k[b] for b in keep), tuple(work.data.v[b] for b in keep))
    return Workload(work.case.replace(layout=layout), data)


def relabel_pages(work: Workload, *, keep_order: bool) -> Workload:
    """Drop unreferenced pages; ``keep_order=False`` also numbers pages in order of use (identity)."""
    lay = work.case.layout
    used = list(lay.kv_indices) if not keep_order else sorted(lay.kv_indices)
    new_id = {page: i for i, page in enumerate(used)}
    pages = [[new_id[p] for p in lay.pages_of(b)] for b in range(lay.batch_size)]
    layout = _layout(lay.qo_lens, lay.kv_lens, pages, lay.page_size, len(used))
    return Workload(work.case.replace(layout=layout), work.data)


def resize(work: Workload, qo_keep: dict[int, tuple[int, int]], kv_keep: dict[int, tuple[int, int]]) -> Workload:
    """Keep query rows ``[a, b)`` and key positions ``[s, e)`` of the named requests (others as
    they are). A shorter request keeps its first pages; the pool is unchanged."""
    lay = work.case.layout
    qo_ranges = [qo_keep.get(b, (0, lay.qo_lens[b])) for b in range(lay.batch_size)]
    kv_ranges = [kv_keep.get(b, (0, lay.kv_lens[b])) for b in range(lay.batch_size)]
    for b, ((a, e), (s, t)) in enumerate(zip(qo_ranges, kv_ranges)):
        if not (0 <= a <= e <= lay.qo_lens[b] and 0 <= s <= t <= lay.kv_lens[b]):
            raise ValueError(f"request {b}: ranges {(a, e)}, {(s, t)} outside qo_len {lay.qo_lens[b]}, kv_len {lay.kv_lens[b]}")
    layout = _layout(
        [e - a for a, e in qo_ranges], [t - s for s, t in kv_ranges],
        [lay.pages_of(b) for b in range(lay.batch_size)], lay.page_size, lay.num_pages,
    )
    data = None
    if work.data is not None:
        rows = torch.cat([torch.arange(lay.qo_indptr[b] + a, lay.qo_indptr[b] + e) for b, (a, e) in enumerate(qo_ranges)])
        k = tuple(t[s:e] for t, (s, e) in zip(work.data.k, kv_ranges))
        v = tuple(t[s:e] for t, (s, e) in zip(work.data.v, kv_ranges))
        data = TokenData(work.data.q[rows.long()], k, v)
    return Workload(work.case.replace(layout=layout), data)


def keep_heads(work: Workload, kv_heads: Sequence[int], members: Sequence[int]) -> Workload:
    """KV heads ``kv_heads`` and, of each one's group of qo heads, the members ``members``."""
    case, group = work.case, work.case.heads.group_size
    qo_heads = [kv * group + m for kv in kv_heads for m in members]
    heads = Heads(len(qo_heads), len(kv_heads), case.heads.head_dim_qk, case.heads.head_dim_vo)
    opts = case.options

    def kept(per_head: tuple[float, ...] | None) -> tuple[float, ...] | None:
        return None if per_head is None else tuple(per_head[h] for h in qo_heads)

    new_case = case.replace(heads=heads, options=dataclasses.replace(opts, alibi_slopes=kept(opts.alibi_slopes),
                                                                      sinks=kept(opts.sinks)))
    data = None
    if work.data is not None:
        kv_index, qo_index = torch.tensor(list(kv_heads)), torch.tensor(qo_heads)
        data = TokenData(
            work.data.q[:, qo_index],
            tuple(t[:, kv_index] for t in work.data.k),
            tuple(t[:, kv_index] for t in work.data.v),
        )
    return Workload(new_case, data)


def shrink_head_dims(work: Workload, head_dim_qk: int, head_dim_vo: int) -> Workload:
    """The first ``head_dim_qk`` (q, k) and ``head_dim_vo`` (v) dimensions."""
    h = work.case.heads
    heads = Heads(h.num_qo_heads, h.num_kv_heads, head_dim_qk, head_dim_vo)
    data = None
    if work.data is not None:
        data = TokenData(
            work.data.q[..., :head_dim_qk],
            tuple(t[..., :head_dim_qk] for t in work.data.k),
            tuple(t[..., :head_dim_vo] for t in work.data.v),
        )
    return Workload(work.case.replace(heads=heads), data)


def set_options(work: Workload, **changes: Any) -> Workload:
    """Change options. A new ``kv_dtype`` converts the stored values: the dequantized value
    (stored * scale) rounded to the new dtype, so the scales must be 1 after the change."""
    opts = dataclasses.replace(work.case.options, **changes)
    data = work.data
    old = work.case.options
    if data is not None and opts.kv_dtype != old.kv_dtype:
        dtype = torch_dtype(opts.kv_dtype)
        k = tuple((t.to(torch.float32) * old.k_scale).to(dtype) for t in data.k)
        v = tuple((t.to(torch.float32) * old.v_scale).to(dtype) for t in data.v)
        data = TokenData(data.q, k, v)
    return Workload(work.case.replace(options=opts), data)


def default_storage(work: Workload) -> Workload:
    """The same values in the default memory layout (contiguous q, separate NHD caches)."""
    return Workload(work.case.replace(storage=None), work.data)


def regenerate(work: Workload, *, seed: int, distribution: str) -> Workload:
    """Generated tensors (``pa_oracle.oracle.tensors.make_tensors``) instead of the current data."""
    return Workload(work.case.replace(seed=seed, distribution=distribution), None)
