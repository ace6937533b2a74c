"""Deterministic tensors for a case: queries and a paged KV pool, made from a seed and a data
distribution, or read from an npz sidecar (never unpickled).

Values depend on the *logical* token (request, position), not on where its page sits, so page
relabeling changes nothing but addresses. Every slot the layout does not reference is poison
(NaN), so a kernel that reads outside its pages shows it. A case's ``Storage`` moves the same
values into other memory (``in_storage``): combined K/V, HND pages, q inside a fused QKV buffer,
caches at an offset in a pool whose other elements are poison.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from pa_oracle.oracle.case import POOL_OFFSET_MULTIPLE, Case, CaseError, Storage

POISON = float("nan")  # every unreferenced slot of the pool
BITS_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # element size -> int dtype


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


@dataclass
class Tensors:
    """The inputs of one call: ``q`` [total_q, Hq, Dqk], caches [num_pages, page_size, Hkv, D] (NHD).

    Under a ``Storage`` these are views (possibly strided) into the memory the storage describes, still
    indexed as NHD: the oracle reads through them, and ``paged_kv`` gives a library its own form.
    ``pool`` is the one buffer holding both caches (with the poison around them), ``kv_cache`` the
    single ``[num_pages, 2, ...]`` tensor of a combined storage (in ``storage.kv_layout`` order) and
    ``q_buffer`` the fused QKV buffer q is a view of; each None when the storage has none.
    """

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    storage: Storage | None = None
    pool: torch.Tensor | None = None
    kv_cache: torch.Tensor | None = None
    q_buffer: torch.Tensor | None = None

    def to(self, device: str | torch.device) -> Tensors:
        if self.pool is not None or self.q_buffer is not None:
            return self._rebuilt(lambda t: t.to(device))
        k_cache = self.k_cache.to(device)
        if self.v_is_latent_view():  # MLA: V stays a view of the latent cache
            return Tensors(self.q.to(device), k_cache, k_cache[..., : self.v_cache.shape[-1]])
        return Tensors(self.q.to(device), k_cache, self.v_cache.to(device))

    def copy(self) -> Tensors:
        """A private copy, bit for bit (poison, NaN payloads and a storage's other elements included),
        with the same strides and storage: a write to one never reaches the other. The judge keeps
        the tensors it drew and hands a kernel their copy."""
        if self.pool is not None or self.q_buffer is not None:
            return self._rebuilt(torch.clone)
        k_cache = self.k_cache.clone()
        if self.v_is_latent_view():
            return Tensors(self.q.clone(), k_cache, k_cache[..., : self.v_cache.shape[-1]])
        return Tensors(self.q.clone(), k_cache, self.v_cache.clone())

    def _rebuilt(self, make: Callable[[torch.Tensor], torch.Tensor]) -> Tensors:
        """The same storage over ``make`` of each buffer (a move, a copy), the views rebuilt over them."""
        moved = replace(self)
        for base, views in (("pool", ("k_cache", "v_cache", "kv_cache")), ("q_buffer", ("q",))):
            old = getattr(self, base)
            if old is None:
                continue
            new = make(old)
            setattr(moved, base, new)
            for name in views:
                view = getattr(self, name)
                if view is not None:
                    setattr(moved, name, _rebased(view, old, new))
        if self.q_buffer is None:
            moved.q = make(self.q)
        return moved

    @property
    def kv_layout(self) -> str:
        """The page layout the caches are stored in ("NHD" or "HND")."""
        return self.storage.kv_layout if self.storage is not None else "NHD"

    def paged_kv(self, kv_layout: str) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """K and V as a library reading ``kv_layout`` pages takes them, without a copy: the single
        ``[num_pages, 2, ...]`` tensor when stored combined in that layout, else ``(k, v)`` views in
        that layout's axis order (strided where the storage differs)."""
        if self.kv_cache is not None and kv_layout == self.kv_layout:
            return self.kv_cache
        if kv_layout == "HND":
            return self.k_cache.transpose(1, 2), self.v_cache.transpose(1, 2)
        return self.k_cache, self.v_cache

    def v_is_latent_view(self) -> bool:
        """True when ``v_cache`` is ``k_cache[..., :d]`` (the MLA layout), the same memory."""
        k, v = self.k_cache, self.v_cache
        return (
            v.data_ptr() == k.data_ptr() and v.stride() == k.stride() and v.shape[:-1] == k.shape[:-1]
            and v.shape[-1] <= k.shape[-1] and v.dtype == k.dtype
        )

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The logical tensors (what a sidecar holds)."""
        return {"q": self.q, "k_cache": self.k_cache, "v_cache": self.v_cache}

    def memory(self) -> dict[str, torch.Tensor]:
        """Every element a kernel is handed, by name: the whole fused QKV buffer and the whole pool
        (poison, the offset region and both halves of a combined tensor included) under a storage."""
        memory = {"q": self.q} if self.q_buffer is None else {"q_buffer": self.q_buffer}
        if self.pool is None:
            return memory | {"k_cache": self.k_cache, "v_cache": self.v_cache}
        return memory | {"kv_pool": self.pool}

    def fingerprint(self, extra: Mapping[str, torch.Tensor] | None = None) -> dict[str, str]:
        """A cryptographic digest (``digest``) of each tensor a kernel is handed (``memory``: the whole
        buffers under a storage), and of ``extra`` (index tensors, block tables), by name: equal digests,
        equal bits."""
        return {name: digest(t) for name, t in {**self.memory(), **(extra or {})}.items()}


def _rebased(view: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``view`` of buffer ``old`` as the same view of ``new`` (a copy of ``old``, maybe elsewhere)."""
    offset = new.storage_offset() + view.storage_offset() - old.storage_offset()
    return new.as_strided(view.shape, view.stride(), offset)


def raw_bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers of the same width (bf16 and fp8 have no comparisons of bits)."""
    return t.contiguous().view(BITS_OF_SIZE[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (NaN payloads and -0.0 included), ``b`` read where ``a`` is."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(raw_bits(a), raw_bits(b).to(a.device))


DIGEST_CHUNK = 1 << 26  # bytes read back to the host at a time by ``digest``


def digest(t: torch.Tensor) -> str:
    """blake2b of a tensor's dtype, shape and raw bits (NaN payloads and -0.0 included), read in
    chunks of ``DIGEST_CHUNK`` bytes, so a many-GiB pool on a device needs no host copy of it whole.
    Unlike a sum of the bits, no change of the bits that keeps the digest is known."""
    hasher = hashlib.blake2b(digest_size=32)
    hasher.update(repr((str(t.dtype), tuple(t.shape))).encode())
    bits = raw_bits(t.detach()).flatten()
    step = max(DIGEST_CHUNK // max(t.element_size(), 1), 1)
    for start in range(0, bits.numel(), step):
        hasher.update(bits[start : start + step].cpu().numpy().tobytes())
    return hasher.hexdigest()


def _master(gen: torch.Generator, shape: tuple[int, ...], distribution: str, role: str) -> torch.Tensor:
    """Float64 values of one role ('q', 'k' or 'v') drawn from the named distribution."""
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    if distribution == "peaked" and role in ("q", "k"):
        return x * 3.0  # logits with std ~9: softmax concentrates on a few keys
    if distribution == "outliers":
        mask = torch.rand(shape, generator=gen, dtype=torch.float64) < 0.01
        return torch.where(mask, x * 20.0, x)
    if distribution == "near_ties" and role == "k" and shape[0] > 0:
        # keys are noisy copies of three prototypes per head: many logits tie to ~1e-3
        prototypes = torch.randn((3, *shape[1:]), generator=gen, dtype=torch.float64)
        pick = torch.randint(0, 3, (shape[0],), generator=gen)
        return prototypes[pick] + 1e-3 * x
    if distribution == "exact":
        # multiples of 1/8 in [-1, 1]: exact in fp16, bf16 and both fp8 formats
        return torch.randint(-8, 9, shape, generator=gen).to(torch.float64) / 8.0
    return x


def make_tensors(case: Case, device: str | torch.device = "cpu") -> Tensors:
    """The case's tensors on ``device``: from its npz sidecar, or generated from its seed, in the
    case's ``storage`` (the same values whatever the storage)."""
    if case.tensors_file is not None:
        return in_storage(case, load_tensors(case, case.tensors_file).to(device))
    return in_storage(case, placed(case, host_draw(case), device))


@dataclass(frozen=True)
class HostDraw:
    """The host half of a seeded case's tensors (``host_draw``): q in its dtype, K and V as the
    pool stores them (divided by their scale, in the kv dtype; V None for MLA, a view of the
    latent cache) in logical token order, and every key token's (page, slot); ``placed`` makes the
    device tensors from it."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor | None
    pages: torch.Tensor
    slots: torch.Tensor


def host_draw(case: Case) -> HostDraw:
    """The values of ``case``'s seed on the host (float64 draws in the order q, K, V, then rounded
    to the stored dtypes): what generating a case costs the host, independent of any device."""
    layout, heads, opts = case.layout, case.heads, case.options
    gen = torch.Generator().manual_seed(case.seed)
    q = _master(gen, (layout.total_q, heads.num_qo_heads, heads.head_dim_qk), case.distribution, "q")
    total_kv = sum(layout.kv_lens)
    k = _master(gen, (total_kv, heads.num_kv_heads, heads.head_dim_qk), case.distribution, "k")
    # MLA: one latent cache, V a view of its first d_ckv dims (no V is drawn)
    v = None if heads.mla else _master(gen, (total_kv, heads.num_kv_heads, heads.head_dim_vo), case.distribution, "v")
    kv_dtype = torch_dtype(opts.kv_dtype)
    stored = lambda x, scale: (x / scale).to(torch.float32).to(kv_dtype)  # noqa: E731 - as the pool holds it
    pages, slots = token_addresses(case)
    if opts.q_is_fp8:  # stored as q / q_scale, as an fp8 cache stores k / k_scale
        q = (q / opts.q_scale).to(torch.float32)
    return HostDraw(q.to(torch_dtype(opts.q_dtype)), stored(k, opts.k_scale),
                    None if v is None else stored(v, opts.v_scale), pages, slots)


def placed(case: Case, draw: HostDraw, device: str | torch.device) -> Tensors:
    """``draw``'s tensors on ``device`` in the default storage (contiguous q, separate poisoned NHD
    caches). On the CPU q is ``draw.q`` itself: a draw serves one call."""
    pages, slots = draw.pages.to(device), draw.slots.to(device)
    if draw.v is None:
        latent = _pool(case, draw.k, pages, slots, device)
        return Tensors(draw.q.to(device), latent, latent[..., : case.heads.head_dim_vo])
    return Tensors(draw.q.to(device), _pool(case, draw.k, pages, slots, device), _pool(case, draw.v, pages, slots, device))


def _generated(case: Case, device: str | torch.device) -> Tensors:
    """The tensors of ``case``'s seed in the default storage (contiguous q, separate NHD caches)."""
    return placed(case, host_draw(case), device)


def _pool(case: Case, stored: torch.Tensor, pages: torch.Tensor, slots: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """A poisoned pool holding ``stored`` (logical token order, already in the kv dtype)."""
    layout = case.layout
    # the pool is made on the device: a huge-pool case would not fit twice in host memory
    pool = torch.full(
        (layout.num_pages, layout.page_size, stored.shape[1], stored.shape[-1]), POISON, device=device
    ).to(stored.dtype)
    pool[pages, slots] = stored.to(device)
    return pool


def in_storage(case: Case, tensors: Tensors) -> Tensors:
    """``tensors`` (default storage) moved into ``case.storage``: one poisoned buffer holding the
    caches at ``pool_offset`` (then as many poison elements after them), laid out by ``pool_layout``
    (combined, cross-layer or K then V; NHD or HND; padded pages; a head-dim stride); q copied into a
    poisoned fused QKV buffer. Every element is copied bit for bit (poison slots included); the
    returned views index as NHD."""
    storage = case.storage
    if storage is None:
        return tensors
    q_buffer, q = None, tensors.q
    if storage.q == "fused_qkv":
        heads = case.heads
        width = (heads.num_qo_heads + 1) * heads.head_dim_qk if heads.mla else (
            heads.num_qo_heads * heads.head_dim_qk + heads.num_kv_heads * (heads.head_dim_qk + heads.head_dim_vo))
        q_buffer = _poison((q.shape[0], width), q.dtype, q.device)
        q = q_buffer[:, : q.shape[1] * q.shape[2]].view(q.shape)
        q.copy_(tensors.q)
    k, v = tensors.k_cache, tensors.v_cache
    latent = tensors.v_is_latent_view()  # MLA: one latent cache, V its first dims
    where = pool_layout(storage, tuple(k.shape), None if latent else v.shape[-1])
    pool = _poison((where.pool_size,), k.dtype, k.device)
    stored_k = _cache_view(pool, where.k_start, where.k_page_stride, tuple(k.shape), storage)
    stored_k.copy_(k)
    if latent:
        return Tensors(q, stored_k, stored_k[..., : v.shape[-1]], storage, pool, None, q_buffer)
    stored_v = _cache_view(pool, where.v_start, where.v_page_stride, tuple(v.shape), storage)
    stored_v.copy_(v)
    kv_cache = None
    if storage.kv == "combined":  # one [pages, 2, ...] tensor in the stored page order, V one K-page after K
        inner = stored_k.transpose(1, 2) if storage.kv_layout == "HND" else stored_k
        kv_cache = pool.as_strided((k.shape[0], 2, *inner.shape[1:]), (where.k_page_stride, where.v_start - where.k_start,
                                                                        *inner.stride()[1:]), where.k_start)
    return Tensors(q, stored_k, stored_v, storage, pool, kv_cache, q_buffer)


@dataclass(frozen=True)
class PoolLayout:
    """Where a storage puts the caches in its pool, in elements: K's and V's first page, their page
    strides and the pool's size."""

    k_start: int
    v_start: int
    k_page_stride: int
    v_page_stride: int
    pool_size: int


def pool_layout(storage: Storage, k_shape: tuple[int, ...], head_dim_vo: int | None) -> PoolLayout:
    """The ``PoolLayout`` of caches of NHD shape ``k_shape`` (V's head dim ``head_dim_vo``; None: MLA's
    latent cache alone). K and V lie side by side in each page when combined or cross-layer (a page holds
    every layer's K and V, ``[layers, 2, ...]``), else K's pages then V's (V aligned to
    ``POOL_OFFSET_MULTIPLE``); each page is followed by ``page_padding`` poison elements; the dense
    sizes are ``dim_stride`` times the values'. ``pool_offset`` poison elements lie before and after."""
    pages, page_size, heads, dim = k_shape
    per_token = page_size * heads * storage.dim_stride
    k_page, v_page = per_token * dim, per_token * (head_dim_vo or 0)
    start, pad = storage.pool_offset, storage.page_padding
    if head_dim_vo is not None and storage.kv == "separate" and storage.layers == 1:
        k_stride, v_stride = k_page + pad, v_page + pad
        v_start = -(-(start + pages * k_stride) // POOL_OFFSET_MULTIPLE) * POOL_OFFSET_MULTIPLE
        return PoolLayout(start, v_start, k_stride, v_stride, v_start + pages * v_stride + start)
    pair = k_page + v_page  # one layer's page: K, then V (none for MLA)
    stride = storage.layers * pair + pad
    k_start = start + storage.layer * pair
    return PoolLayout(k_start, k_start + k_page, stride, stride, start + pages * stride + start)


def _cache_view(pool: torch.Tensor, start: int, page_stride: int, shape: tuple[int, ...], storage: Storage) -> torch.Tensor:
    """The NHD-indexed ``[pages, page_size, heads, dim]`` view of a cache at ``start`` of ``pool``, its
    pages ``page_stride`` apart, laid out ``storage.kv_layout`` within a page, ``dim_stride`` apart."""
    _, page_size, heads, dim = shape
    step = storage.dim_stride
    inner = (dim * step, page_size * dim * step) if storage.kv_layout == "HND" else (heads * dim * step, dim * step)
    return pool.as_strided(shape, (page_stride, *inner, step), start)


def _poison(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.full(shape, POISON, device=device).to(dtype)


def upload(host: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without a stream sync: a copy from pageable memory synchronizes
    the CUDA stream, an asynchronous one from pinned memory does not. On CPU: ``host`` itself."""
    device = torch.device(device)
    if device.type == "cpu":
        return host
    return (host.pin_memory() if device.type == "cuda" else host).to(device, non_blocking=True)


def _page_table(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Every page-table entry (``kv_indices``, request-major: the pages in token order) and how
    many of its page's slots hold tokens (``page_size``, or ``kv_last_page_len`` on a request's
    last page)."""
    layout = case.layout
    pages = np.fromiter(layout.kv_indices, dtype=np.int64, count=len(layout.kv_indices))
    filled = np.full(len(pages), layout.page_size, dtype=np.int64)
    has_pages = np.diff(np.asarray(layout.kv_indptr, dtype=np.int64)) > 0
    last_entry = np.asarray(layout.kv_indptr[1:], dtype=np.int64)[has_pages] - 1
    filled[last_entry] = np.asarray(layout.kv_last_page_len, dtype=np.int64)[has_pages]
    return pages, filled


def token_slots(case: Case) -> np.ndarray:
    """Flat pool slot (``page * page_size + slot``) of every key token, in logical order
    (request-major, then position): int64 numpy, for all requests at once (a torch loop over the
    requests cost ~0.4 ms each on the host)."""
    pages, filled = _page_table(case)
    slots = np.repeat(pages * case.layout.page_size - (np.cumsum(filled) - filled), filled)
    slots += np.arange(len(slots), dtype=np.int64)
    return slots


def token_addresses(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """(page, slot) of every key token, in logical order (request-major, then position): int64."""
    pages, filled = _page_table(case)
    slots = np.repeat(np.cumsum(filled) - filled, filled)  # each token's entry's first token
    np.subtract(np.arange(len(slots), dtype=np.int64), slots, out=slots)
    return torch.from_numpy(np.repeat(pages, filled)), torch.from_numpy(slots)


def gather_kv(case: Case, tensors: Tensors, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantized keys and values of every token, logical order: [total_kv, Hkv, D] in ``dtype``."""
    pages, slots = (t.to(tensors.k_cache.device) for t in token_addresses(case))
    opts = case.options
    keys = tensors.k_cache[pages, slots].to(dtype)
    values = tensors.v_cache[pages, slots].to(dtype)
    if opts.is_fp8:
        keys, values = keys * opts.k_scale, values * opts.v_scale
    return keys, values


def query_values(case: Case, tensors: Tensors, dtype: torch.dtype) -> torch.Tensor:
    """q's values in ``dtype``: the stored q, times ``q_scale`` for an fp8 q (as ``gather_kv`` for fp8 KV)."""
    q = tensors.q.to(dtype)
    return q * case.options.q_scale if case.options.q_is_fp8 else q


def signal_strength(case: Case, tensors: Tensors) -> float:
    """Median over query rows of the std of the scaled logits across keys (0 when no signal).

    Near-uniform inputs (vLLM's ``uniform(+-1e-3)``) score ~1e-6 and carry no signal: any
    kernel passes on them.
    """

    keys, _ = gather_kv(case, tensors, torch.float64)
    q = query_values(case, tensors, torch.float64)
    layout, group = case.layout, case.heads.group_size
    stds = []
    for b in range(layout.batch_size):
        rows = q[layout.qo_indptr[b] : layout.qo_indptr[b + 1]][:4]
        start = sum(layout.kv_lens[:b])
        k = keys[start : start + layout.kv_lens[b]]
        if len(rows) == 0 or len(k) < 2:
            continue
        logits = torch.einsum("qhd,khd->qhk", rows, k.repeat_interleave(group, dim=1)) * case.sm_scale
        stds.append(logits.std(dim=-1).flatten())
    if not stds:
        return float("inf")
    return float(torch.cat(stds).median())


MIN_SIGNAL = 1e-2


def check_signal(case: Case, tensors: Tensors) -> None:
    """Refuse inputs whose logits are near-uniform: a comparison on them proves nothing."""
    strength = signal_strength(case, tensors)
    if strength < MIN_SIGNAL:
        raise CaseError(
            f"near-uniform inputs: median logit std {strength:.2e} < {MIN_SIGNAL:g}; "
            "every kernel agrees on such data, so it carries no signal"
        )


# --- npz sidecar ------------------------------------------------------------------------------


def save_tensors(tensors: Tensors, path: str | Path) -> Path:
    """Write tensors as raw bits plus dtype names (bf16 and fp8 have no numpy dtype)."""
    arrays: dict[str, np.ndarray] = {}
    for name, t in tensors.as_dict().items():
        arrays[f"{name}__bits"] = raw_bits(t.cpu()).numpy()
        arrays[f"{name}__dtype"] = np.array(str(t.dtype).removeprefix("torch."))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez_compressed(f, allow_pickle=False, **arrays)  # bits and dtype names: nothing to pickle
    return path


def tensors_digest(tensors: Tensors) -> str:
    """sha256 of the tensors' names, dtypes, shapes and raw bits: what a sidecar holds, independent
    of the file (npz members carry timestamps) and of where it is."""
    digest = hashlib.sha256()
    for name, t in tensors.as_dict().items():
        digest.update(json.dumps([name, str(t.dtype), list(t.shape)]).encode())
        digest.update(raw_bits(t.detach().cpu()).numpy().tobytes())
    return digest.hexdigest()


def saved_form(case: Case, tensors: Tensors, meta: dict | None = None) -> Case:
    """``case`` as a case folder holds it: its tensors in the sidecar ``tensors.npz``, named by
    their content (``tensors_sha256``), so its id is the same wherever the folder is copied."""
    return case.replace(tensors_file="tensors.npz", tensors_sha256=tensors_digest(tensors), meta=case.meta if meta is None else meta)


def write_case(saved: Case, tensors: Tensors, folder: str | Path) -> Case:
    """Write ``folder/case.json`` and ``folder/tensors.npz`` for a case in its ``saved_form``."""
    save_tensors(tensors, Path(folder) / "tensors.npz")
    saved.save(Path(folder) / "case.json")
    return saved


def save_case(case: Case, folder: str | Path, tensors: Tensors | None = None, *, meta: dict | None = None) -> Case:
    """Write ``case`` (with ``tensors``, else its own) as a case folder; return it as saved. A
    campaign publishes such a folder whole (``pa_oracle.fuzz.campaign.findings``)."""
    tensors = tensors if tensors is not None else make_tensors(case, "cpu")
    return write_case(saved_form(case, tensors, meta), tensors, folder)


_SIDECAR_ARRAYS = ("q", "k_cache", "v_cache")
_NPZ_ERRORS = (OSError, ValueError, EOFError, KeyError, AttributeError, MemoryError, zipfile.BadZipFile, zlib.error)  # what a bad archive raises (a duplicate member, a header claiming TiBs)


def load_tensors(case: Case, path: str | Path) -> Tensors:
    """Read an npz sidecar and check it against the case: the arrays it must hold and no other,
    their shapes and dtypes (never unpickled), and a finite value in every element the case
    references (each q row, each K/V slot of a token; unreferenced slots may hold anything).
    Every problem is a ``CaseError`` that names the file and the array."""
    path = Path(path)
    if not path.is_file():
        raise CaseError(f"{path}: tensors file not found (the case's tensors_file)")
    try:
        archive = np.load(path, allow_pickle=False)
    except _NPZ_ERRORS as exc:
        raise CaseError(f"{path}: not a readable npz archive ({type(exc).__name__}: {exc})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise CaseError(f"{path}: holds one array, not an npz archive of {', '.join(_SIDECAR_ARRAYS)}")
    with archive:
        _check_array_names(path, set(archive.files))
        loaded = {name: _read_array(case, path, archive, name) for name in _SIDECAR_ARRAYS}
    tensors = Tensors(loaded["q"], loaded["k_cache"], loaded["v_cache"])
    if case.heads.mla:
        latent_v = tensors.k_cache[..., : case.heads.head_dim_vo]
        if not torch.equal(raw_bits(latent_v), raw_bits(tensors.v_cache)):
            raise CaseError(f"{path}: an MLA case's v_cache must be the first head_dim_vo dims of k_cache, bit for bit")
        tensors = Tensors(tensors.q, tensors.k_cache, latent_v)
    _check_referenced_finite(case, path, tensors)
    try:
        check_signal(case, tensors)
    except CaseError as exc:
        raise CaseError(f"{path}: {exc}") from None
    return tensors


def _expected_arrays(case: Case) -> dict[str, tuple[tuple[int, ...], str]]:
    layout, heads, opts = case.layout, case.heads, case.options
    return {
        "q": ((layout.total_q, heads.num_qo_heads, heads.head_dim_qk), opts.q_dtype),
        "k_cache": ((layout.num_pages, layout.page_size, heads.num_kv_heads, heads.head_dim_qk), opts.kv_dtype),
        "v_cache": ((layout.num_pages, layout.page_size, heads.num_kv_heads, heads.head_dim_vo), opts.kv_dtype),
    }


def _check_array_names(path: Path, names: set[str]) -> None:
    wanted = {f"{name}__{part}" for name in _SIDECAR_ARRAYS for part in ("bits", "dtype")}
    missing, unknown = sorted(wanted - names), sorted(names - wanted)
    if missing or unknown:
        problems = ([f"missing arrays {missing}"] if missing else []) + ([f"unknown arrays {unknown}"] if unknown else [])
        raise CaseError(f"{path}: {'; '.join(problems)} (a sidecar holds exactly {sorted(wanted)})")


def _read_array(case: Case, path: Path, archive: np.lib.npyio.NpzFile, name: str) -> torch.Tensor:
    """Array ``name`` (``NAME__bits`` viewed as ``NAME__dtype``), checked against the case."""
    shape, dtype_name = _expected_arrays(case)[name]
    dtype_array = _member(path, archive, f"{name}__dtype")
    if dtype_array.shape != () or dtype_array.dtype.kind != "U":
        raise CaseError(f"{path}: array {name}__dtype must be one string, got {dtype_array.dtype} of shape {dtype_array.shape}")
    if str(dtype_array) != dtype_name:
        raise CaseError(f"{path}: {name} is {str(dtype_array)[:40]!r}, the case needs {dtype_name}")
    bits = _member(path, archive, f"{name}__bits")
    dtype = torch_dtype(dtype_name)
    raw = np.dtype(str(BITS_OF_SIZE[dtype.itemsize]).removeprefix("torch."))
    if bits.dtype != raw:
        raise CaseError(f"{path}: array {name}__bits is {bits.dtype}, the raw bits of {dtype_name} are {raw}")
    if bits.shape != shape:
        raise CaseError(f"{path}: {name} is {bits.shape} {dtype_name}, the case needs {shape} {dtype_name}")
    return torch.from_numpy(np.ascontiguousarray(bits).copy()).view(dtype)


def _member(path: Path, archive: np.lib.npyio.NpzFile, member: str) -> np.ndarray:
    """One array of the archive; a member that cannot be read, or is no ``.npy`` array (a duplicate
    or foreign member), is a ``CaseError`` naming it."""
    try:
        array = archive[member]
    except _NPZ_ERRORS as exc:
        raise CaseError(f"{path}: array {member} is unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(array, np.ndarray):
        raise CaseError(f"{path}: member {member} is not an .npy array (a duplicate or foreign member)")
    return array


def _check_referenced_finite(case: Case, path: Path, tensors: Tensors) -> None:
    """A NaN or inf where the case reads would make a correct kernel fail; elsewhere it is poison."""
    bad_rows = (~torch.isfinite(tensors.q.float())).flatten(1).any(1).nonzero().flatten()
    if len(bad_rows):
        row = int(bad_rows[0])
        raise CaseError(f"{path}: q row {row} holds a NaN or inf ({len(bad_rows)} such rows): every query row is read")
    slots = torch.from_numpy(token_slots(case))
    page_size = case.layout.page_size
    for name in ("k_cache", "v_cache"):
        pool = getattr(tensors, name)
        values = pool.reshape(-1, *pool.shape[2:])[slots].float()
        bad = (~torch.isfinite(values)).flatten(1).any(1).nonzero().flatten()
        if len(bad):
            token = int(bad[0])
            request = next(b for b in range(case.layout.batch_size) if token < sum(case.layout.kv_lens[: b + 1]))
            position = token - sum(case.layout.kv_lens[:request])
            page, slot = divmod(int(slots[token]), page_size)
            raise CaseError(
                f"{path}: {name}[page {page}, slot {slot}] (request {request}, key {position}) holds a NaN or inf "
                f"({len(bad)} such slots): a slot the case reads must be finite"
            )


def load_case(path: str | Path) -> Case:
    """Read a case file; its npz sidecar, if it names one, is read and checked too, so a bad sidecar
    is refused here, naming its file and array, not when a kernel runs."""
    case = Case.load_json(path)
    if case.tensors_file is not None:
        digest = tensors_digest(load_tensors(case, case.tensors_file))
        if case.tensors_sha256 is not None and case.tensors_sha256 != digest:
            raise CaseError(
                f"{path}: its sidecar {case.tensors_file} does not hold the tensors the case names "
                f"(tensors_sha256 {case.tensors_sha256[:12]}..., the file's content {digest[:12]}...)"
            )
        case = case.replace(tensors_sha256=digest)  # the id is the sidecar's content, not its path
    return case
