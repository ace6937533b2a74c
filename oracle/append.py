"""The KV-cache write path: what appending tokens to a paged pool must do, byte for byte.

An ``AppendCase`` is a batch of requests, each holding ``seq_lens_before[b]`` tokens in its pages
and appending ``append_lens[b]`` more. Page ``j`` of request ``b`` is ``kv_indices[kv_indptr[b] + j]``
(the indices already cover the appended tokens, as FlashInfer's ``append_paged_kv_cache`` and
vLLM's ``reshape_and_cache`` require), and token ``p`` of a request lives in its page ``p // page_size``
at slot ``p % page_size``. Appended token ``i`` of request ``b`` has position ``seq_lens_before[b] + i``.

The pool is filled with canaries (random bits) before the write. After the write the pool must
equal the canaries everywhere except the appended slots, which hold exactly the appended values
(no conversion: the appended tensors are given in the cache dtype). An fp8 cache (``float8_e4m3fn``,
``float8_e5m2``) quantises on write, as vLLM's ``reshape_and_cache`` does: the appended values come in
``append_dtype`` and slot ``i`` must hold ``value / k_scale`` (``v_scale`` for V) computed in float64 and
rounded once to the fp8 format (nearest, ties to even; beyond the largest finite value, saturated), or
the neighbouring fp8 value where the float64 quotient lies within ``FP8_SLACK`` (relative) of a rounding
tie: the one difference that computing the quotient in float32 makes. ``padding`` extra token rows come
after the real ones with slot -1 (CUDA-graph padding: ``slot_mapping``, ``batch_indices`` and ``positions``
-1): a correct write stores nothing for them. A layout is NHD
(``[pages, page_size, heads, dim]``) or HND (``[pages, heads, page_size, dim]``), and K and V are
two tensors or one ``[pages, 2, ...]`` tensor whose halves are non-contiguous views.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from pa_oracle.oracle.case import CaseError
from pa_oracle.oracle.tensors import BITS_OF_SIZE, raw_bits

LAYOUTS = ("NHD", "HND")
DTYPES = ("bfloat16", "float16", "float32")
FP8_CACHE_DTYPES = ("float8_e4m3fn", "float8_e5m2")  # quantised on write with the case's scales
CACHE_DTYPES = DTYPES + FP8_CACHE_DTYPES
FP8_SLACK = 2.0**-22  # relative: float32 rounding of the scale, the quotient (and a reciprocal) stays within it
_NEW_FIELDS = {"append_dtype": None, "k_scale": 1.0, "v_scale": 1.0, "padding": 0}  # left out of JSON at these values


@dataclass(frozen=True)
class AppendCase:
    seq_lens_before: tuple[int, ...]
    append_lens: tuple[int, ...]
    page_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    kv_layout: str = "NHD"
    combined: bool = False  # one [pages, 2, ...] tensor (K = [:, 0], V = [:, 1]) instead of two
    spare_pages: int = 2  # pages no request owns: canaries a stray write would hit
    seed: int = 0
    append_dtype: str | None = None  # the appended values' dtype (None: the cache dtype; required for fp8)
    k_scale: float = 1.0  # fp8 only: stored = value / scale
    v_scale: float = 1.0
    padding: int = 0  # token rows after the real ones with slot -1 (CUDA-graph padding), never stored

    def __post_init__(self) -> None:
        def bad(message: str) -> None:
            raise CaseError(f"append case: {message}")

        if len(self.seq_lens_before) != len(self.append_lens) or not self.append_lens:
            bad("seq_lens_before and append_lens must be non-empty and of one length")
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in (*self.seq_lens_before, *self.append_lens)):
            bad("lengths must be ints >= 0")
        for name in ("page_size", "num_kv_heads", "head_dim"):
            if not 1 <= getattr(self, name) <= 1 << 16:
                bad(f"{name} must be in [1, 65536]")
        if self.dtype not in CACHE_DTYPES:
            bad(f"dtype must be one of {CACHE_DTYPES}")
        self._check_quantisation(bad)
        if self.kv_layout not in LAYOUTS:
            bad(f"kv_layout must be one of {LAYOUTS}")
        if not 0 <= self.spare_pages <= 1 << 16 or not 0 <= self.seed < 2**63:
            bad("spare_pages in [0, 65536], seed in [0, 2**63)")
        if not isinstance(self.padding, int) or isinstance(self.padding, bool) or not 0 <= self.padding <= 1 << 16:
            bad("padding must be an int in [0, 65536]")

    def _check_quantisation(self, bad: Any) -> None:
        """fp8: the appended dtype is a float one and the scales finite numbers > 0; else neither is set."""
        scales = (self.k_scale, self.v_scale)
        if any(isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0 for s in scales):
            bad("k_scale and v_scale must be finite numbers > 0")
        if self.dtype in FP8_CACHE_DTYPES:
            if self.append_dtype not in DTYPES:
                bad(f"an fp8 cache (dtype {self.dtype}) needs append_dtype, one of {DTYPES}")
        elif self.append_dtype not in (None, self.dtype) or scales != (1.0, 1.0):
            bad(f"append_dtype and k_scale/v_scale are for fp8 caches ({FP8_CACHE_DTYPES}) only")

    @property
    def source_dtype(self) -> str:
        """The dtype of the appended values."""
        return self.append_dtype or self.dtype

    @property
    def quantised(self) -> bool:
        return self.dtype in FP8_CACHE_DTYPES

    @property
    def batch_size(self) -> int:
        return len(self.append_lens)

    @property
    def seq_lens_after(self) -> tuple[int, ...]:
        return tuple(b + a for b, a in zip(self.seq_lens_before, self.append_lens))

    @property
    def pages_per_request(self) -> tuple[int, ...]:
        return tuple(-(-n // self.page_size) for n in self.seq_lens_after)

    @property
    def num_pages(self) -> int:
        return sum(self.pages_per_request) + self.spare_pages

    @property
    def total_appended(self) -> int:
        return sum(self.append_lens)

    @property
    def case_id(self) -> str:
        """12 hex digits of the sha256 of its JSON (sorted keys): the id a write campaign draws, rejects,
        resumes and names its findings by (the same as ``writes.case_id`` gave before the engine ran writes)."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:12]

    def summary(self) -> str:
        """One line: ``batch 2, before (3, 0), append (1, 5), page 16, Hkv 2, D 64, bfloat16 NHD``, plus what is set."""
        extra = [name for name, on in (("combined", self.combined), (f"{self.padding} padding rows", self.padding)) if on]
        if self.quantised:
            extra.append(f"from {self.source_dtype}, k_scale {self.k_scale:g}, v_scale {self.v_scale:g}")
        return (f"batch {self.batch_size}, before {self.seq_lens_before}, append {self.append_lens}, page {self.page_size}, "
                f"Hkv {self.num_kv_heads}, D {self.head_dim}, {self.dtype} {self.kv_layout}"
                + "".join(f", {text}" for text in extra))

    def replace(self, **changes: Any) -> AppendCase:
        """Another case with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON; the fp8 and padding fields only when set (a case without them reads as before)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
                if k not in _NEW_FIELDS or v != _NEW_FIELDS[k]}

    @classmethod
    def from_json(cls, data: Any) -> AppendCase:
        if not isinstance(data, dict):
            raise CaseError("append case: expected a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        if unknown := set(data) - known:
            raise CaseError(f"append case: unknown field(s) {sorted(unknown)}")
        try:
            values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
            return cls(**values)
        except TypeError as exc:
            raise CaseError(f"append case: {exc}") from None


class AppendInputs(NamedTuple):
    """What a write kernel is given. ``k_pool``/``v_pool`` are views into ``pool`` when combined. With
    ``padding``, the last ``padding`` rows of the appended values and the per-token tensors are padding:
    slot -1, request -1, position -1."""

    pool: torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # as the library takes it
    k_pool: torch.Tensor  # [pages, page, H, D] (NHD) or [pages, H, page, D] (HND)
    v_pool: torch.Tensor
    append_k: torch.Tensor  # [total_appended + padding, H, D] in ``source_dtype``
    append_v: torch.Tensor
    kv_indices: torch.Tensor  # int32 [sum pages]: each request's pages, the appended tokens included
    kv_indptr: torch.Tensor  # int32 [B + 1]
    kv_last_page_len: torch.Tensor  # int32 [B], after the append (0 for a request with no tokens)
    batch_indices: torch.Tensor  # int32 [total_appended + padding]: the request of each appended token
    positions: torch.Tensor  # int32 [total_appended + padding]: its position in its request
    slot_mapping: torch.Tensor  # int64 [total_appended + padding]: page * page_size + slot (-1: padding)


def _page_table(case: AppendCase) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(case.seed)
    order = rng.permutation(case.num_pages).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(case.pages_per_request)]).astype(np.int32)
    return order[: indptr[-1]], indptr


def _canaries(case: AppendCase, gen: torch.Generator) -> torch.Tensor:
    """[pages, 2, *page] random bits in the cache dtype."""
    dtype = getattr(torch, case.dtype)
    page_shape = ((case.page_size, case.num_kv_heads) if case.kv_layout == "NHD"
                  else (case.num_kv_heads, case.page_size)) + (case.head_dim,)
    bits = BITS_OF_SIZE[torch.empty((), dtype=dtype).element_size()]
    info = torch.iinfo(bits)
    shape = (case.num_pages, 2, *page_shape)
    return torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(bits).view(dtype)


def make_inputs(case: AppendCase, device: str | torch.device = "cpu") -> AppendInputs:
    """Canary-filled pool, appended values and the index tensors, all from ``case.seed``."""
    gen = torch.Generator().manual_seed(case.seed)
    canaries = _canaries(case, gen)
    if case.combined:
        pool: Any = canaries.to(device)
        k_pool, v_pool = pool[:, 0], pool[:, 1]
    else:
        k_pool, v_pool = canaries[:, 0].contiguous().to(device), canaries[:, 1].contiguous().to(device)
        pool = (k_pool, v_pool)
    n, rows = case.total_appended, case.total_appended + case.padding
    source = getattr(torch, case.source_dtype)
    append_k = torch.randn((rows, case.num_kv_heads, case.head_dim), generator=gen, dtype=torch.float32).to(source).to(device)
    append_v = torch.randn((rows, case.num_kv_heads, case.head_dim), generator=gen, dtype=torch.float32).to(source).to(device)
    indices, indptr = _page_table(case)
    last = [(n_after - 1) % case.page_size + 1 if n_after else 0 for n_after in case.seq_lens_after]
    batch = np.repeat(np.arange(case.batch_size), case.append_lens).astype(np.int32)
    positions = np.concatenate([np.arange(b, b + a) for b, a in zip(case.seq_lens_before, case.append_lens)]
                               or [np.zeros(0, np.int64)])
    positions = positions.astype(np.int32)
    pages = indices[indptr[batch] + positions // case.page_size] if n else np.zeros(0, np.int32)
    slots = pages.astype(np.int64) * case.page_size + positions % case.page_size
    pad = lambda a: np.concatenate([a, np.full(case.padding, -1, a.dtype)])  # noqa: E731
    as_tensor = lambda a, t: torch.as_tensor(pad(a), dtype=t).to(device)  # noqa: E731
    return AppendInputs(pool, k_pool, v_pool, append_k, append_v, torch.as_tensor(indices, dtype=torch.int32).to(device),
                        torch.as_tensor(indptr, dtype=torch.int32).to(device), torch.as_tensor(last, dtype=torch.int32).to(device),
                        as_tensor(batch, torch.int32), as_tensor(positions, torch.int32), as_tensor(slots, torch.int64))


def _fp8_grid(dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(values, codes) of the finite non-negative fp8 values, ascending (the code order is the value order)."""
    codes = np.arange(128, dtype=np.uint8)
    values = torch.from_numpy(codes).view(dtype).to(torch.float64).numpy()
    finite = np.isfinite(values)
    return values[finite], codes[finite]


def _round_fp8(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """float64 ``x`` rounded once to fp8 (nearest, ties to the even code, saturated at the largest finite
    value; the sign kept, -0 included), as uint8 codes."""
    values, codes = _fp8_grid(dtype)
    a = np.minimum(np.abs(x), values[-1])
    hi = np.clip(np.searchsorted(values, a, side="left"), 1, len(values) - 1)
    lo = hi - 1
    d_lo, d_hi = a - values[lo], values[hi] - a
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0))
    code = np.where(take_hi, codes[hi], codes[lo])
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def quantised_values(case: AppendCase, values: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(want, also): ``values`` as an fp8 cache must hold them: ``value / scale`` in float64 rounded once;
    ``also`` the rounding of the quotient moved by ``FP8_SLACK`` (equal to ``want`` except next to a tie)."""
    dtype = getattr(torch, case.dtype)
    q = values.detach().cpu().to(torch.float64).numpy() / float(scale)
    want = _round_fp8(q, dtype)
    below, above = _round_fp8(q * (1 - FP8_SLACK), dtype), _round_fp8(q * (1 + FP8_SLACK), dtype)
    also = np.where(below != want, below, above)
    as_fp8 = lambda codes: torch.from_numpy(codes).view(dtype)  # noqa: E731
    return as_fp8(want), as_fp8(also)


def _stored(case: AppendCase, before: AppendInputs) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """For K and V: (the pool before, the values a correct write stores, the values it may store instead)."""
    real = before.slot_mapping.cpu() >= 0
    out = []
    for pool, values, scale in ((before.k_pool, before.append_k, case.k_scale), (before.v_pool, before.append_v, case.v_scale)):
        values = values.cpu()[real]
        want, also = quantised_values(case, values, scale) if case.quantised else (values, values)
        out.append((pool.cpu(), want, also))
    return out


def _filled(case: AppendCase, pool: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    filled = pool.clone()
    pages, within = slots // case.page_size, slots % case.page_size
    if case.kv_layout == "NHD":
        filled[pages, within] = values
    else:
        filled.permute(0, 2, 1, 3)[pages, within] = values
    return filled


def expected_pools(case: AppendCase, before: AppendInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The pools as a correct write leaves them (on the CPU): canaries, appended slots replaced (padding rows
    stored nowhere; fp8 values quantised once, ``quantised_values``)."""
    slots = before.slot_mapping.cpu()
    slots = slots[slots >= 0]
    k, v = (_filled(case, pool, slots, want) for pool, want, _also in _stored(case, before))
    return k, v


class Mismatch(NamedTuple):
    which: str  # "k" or "v"
    page: int
    slot: int
    head: int
    appended: bool  # an appended slot holding wrong bytes (else a canary that was overwritten)


@dataclass(frozen=True)
class AppendVerdict:
    """A write's judgement: ``ok``, the first mismatches and how many rows differ in all."""

    ok: bool
    mismatches: tuple[Mismatch, ...]  # at most ``limit`` of them, in pool order
    count: int  # every (which, page, slot, head) that differs

    def summary(self) -> str:
        if self.ok:
            return "every appended slot holds its value; every other byte is unchanged"
        wrote = sum(m.appended for m in self.mismatches)
        first = self.mismatches[0]
        kind = "an appended slot holds wrong bytes" if first.appended else "a byte outside the appended slots changed"
        return (f"{self.count} (tensor, page, slot, head) rows differ ({wrote} of the first {len(self.mismatches)} "
                f"are appended slots); first: {first.which} page {first.page} slot {first.slot} head {first.head}: {kind}")


def compare_pools(case: AppendCase, before: AppendInputs, k_after: torch.Tensor, v_after: torch.Tensor,
                  limit: int = 20) -> AppendVerdict:
    """Byte-for-byte comparison of the pools a kernel left with ``expected_pools`` (an fp8 slot may also hold
    the other rounding next to a tie: ``quantised_values``)."""
    slots = before.slot_mapping.cpu()
    slots = slots[slots >= 0]
    intended = torch.zeros(case.num_pages, case.page_size, dtype=torch.bool)
    intended[slots // case.page_size, slots % case.page_size] = True
    found: list[Mismatch] = []
    count = 0
    for which, (pool, want, also), got in zip("kv", _stored(case, before), (k_after.cpu(), v_after.cpu())):
        got_bits = raw_bits(got)
        diff = (raw_bits(_filled(case, pool, slots, want)) != got_bits) & (raw_bits(_filled(case, pool, slots, also)) != got_bits)
        rows = diff.any(-1)  # [pages, page, H] or [pages, H, page]
        if case.kv_layout == "HND":
            rows = rows.transpose(1, 2)
        where = rows.nonzero().tolist()
        count += len(where)
        found += [Mismatch(which, p, s, h, bool(intended[p, s])) for p, s, h in where[: limit - len(found)]]
    return AppendVerdict(count == 0, tuple(found), count)
