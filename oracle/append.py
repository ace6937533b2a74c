"""The KV-cache write path: what appending tokens to a paged pool must do, byte for byte.

An ``AppendCase`` is a batch of requests, each holding ``seq_lens_before[b]`` tokens in its pages
and appending ``append_lens[b]`` more. Page ``j`` of request ``b`` is ``kv_indices[kv_indptr[b] + j]``
(the indices already cover the appended tokens, as FlashInfer's ``append_paged_kv_cache`` and
vLLM's ``reshape_and_cache`` require), and token ``p`` of a request lives in its page ``p // page_size``
at slot ``p % page_size``. Appended token ``i`` of request ``b`` has position ``seq_lens_before[b] + i``.

The pool is filled with canaries (random bits) before the write. After the write the pool must
equal the canaries everywhere except the appended slots, which hold exactly the appended values
(no quantization: the appended tensors are given in the cache dtype). A layout is NHD
(``[pages, page_size, heads, dim]``) or HND (``[pages, heads, page_size, dim]``), and K and V are
two tensors or one ``[pages, 2, ...]`` tensor whose halves are non-contiguous views.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from pa_oracle.oracle.case import CaseError
from pa_oracle.oracle.tensors import BITS_OF_SIZE, raw_bits

LAYOUTS = ("NHD", "HND")
DTYPES = ("bfloat16", "float16", "float32")


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
        if self.dtype not in DTYPES:
            bad(f"dtype must be one of {DTYPES}")
        if self.kv_layout not in LAYOUTS:
            bad(f"kv_layout must be one of {LAYOUTS}")
        if not 0 <= self.spare_pages <= 1 << 16 or not 0 <= self.seed < 2**63:
            bad("spare_pages in [0, 65536], seed in [0, 2**63)")

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

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_json(cls, data: Any) -> AppendCase:
        if not isinstance(data, dict):
            raise CaseError("append case: expected a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        if unknown := set(data) - known:
            raise CaseError(f"append case: unknown field(s) {sorted(unknown)}")
        try:
            values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
            return cls(**values)
        except TypeError as exc:
            raise CaseError(f"append case: {exc}") from None


class AppendInputs(NamedTuple):
    """What a write kernel is given. ``k_pool``/``v_pool`` are views into ``pool`` when combined."""

    pool: torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # as the library takes it
    k_pool: torch.Tensor  # [pages, page, H, D] (NHD) or [pages, H, page, D] (HND)
    v_pool: torch.Tensor
    append_k: torch.Tensor  # [total_appended, H, D]
    append_v: torch.Tensor
    kv_indices: torch.Tensor  # int32 [sum pages]: each request's pages, the appended tokens included
    kv_indptr: torch.Tensor  # int32 [B + 1]
    kv_last_page_len: torch.Tensor  # int32 [B], after the append (0 for a request with no tokens)
    batch_indices: torch.Tensor  # int32 [total_appended]: the request of each appended token
    positions: torch.Tensor  # int32 [total_appended]: its position in its request
    slot_mapping: torch.Tensor  # int64 [total_appended]: page * page_size + slot


def _page_table(case: AppendCase) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(case.seed)
    order = rng.permutation(case.num_pages).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(case.pages_per_request)]).astype(np.int32)
    return order[: indptr[-1]], indptr


def make_inputs(case: AppendCase, device: str | torch.device = "cpu") -> AppendInputs:
    """Canary-filled pool, appended values and the index tensors, all from ``case.seed``."""
    dtype = getattr(torch, case.dtype)
    gen = torch.Generator().manual_seed(case.seed)
    page_shape = ((case.page_size, case.num_kv_heads) if case.kv_layout == "NHD"
                  else (case.num_kv_heads, case.page_size)) + (case.head_dim,)
    bits = BITS_OF_SIZE[torch.empty((), dtype=dtype).element_size()]
    info = torch.iinfo(bits)
    shape = (case.num_pages, 2, *page_shape)
    canaries = torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(bits).view(dtype)
    if case.combined:
        pool: Any = canaries.to(device)
        k_pool, v_pool = pool[:, 0], pool[:, 1]
    else:
        k_pool, v_pool = canaries[:, 0].contiguous().to(device), canaries[:, 1].contiguous().to(device)
        pool = (k_pool, v_pool)
    n = case.total_appended
    append_k = torch.randn((n, case.num_kv_heads, case.head_dim), generator=gen, dtype=torch.float32).to(dtype).to(device)
    append_v = torch.randn((n, case.num_kv_heads, case.head_dim), generator=gen, dtype=torch.float32).to(dtype).to(device)
    indices, indptr = _page_table(case)
    last = [(n_after - 1) % case.page_size + 1 if n_after else 0 for n_after in case.seq_lens_after]
    batch = np.repeat(np.arange(case.batch_size), case.append_lens).astype(np.int32)
    positions = np.concatenate([np.arange(b, b + a) for b, a in zip(case.seq_lens_before, case.append_lens)] or [[]])
    positions = positions.astype(np.int32)
    pages = indices[indptr[batch] + positions // case.page_size] if n else np.zeros(0, np.int32)
    slots = pages.astype(np.int64) * case.page_size + positions % case.page_size
    as_tensor = lambda a, t: torch.as_tensor(a, dtype=t).to(device)  # noqa: E731
    return AppendInputs(pool, k_pool, v_pool, append_k, append_v, as_tensor(indices, torch.int32),
                        as_tensor(indptr, torch.int32), as_tensor(last, torch.int32), as_tensor(batch, torch.int32),
                        as_tensor(positions, torch.int32), as_tensor(slots, torch.int64))


def expected_pools(case: AppendCase, before: AppendInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The pools as a correct write leaves them (on the CPU): canaries, appended slots replaced."""
    k, v = before.k_pool.cpu().clone(), before.v_pool.cpu().clone()
    slots = before.slot_mapping.cpu()
    pages, within = slots // case.page_size, slots % case.page_size
    for pool, values in ((k, before.append_k.cpu()), (v, before.append_v.cpu())):
        if case.kv_layout == "NHD":
            pool[pages, within] = values
        else:
            pool.permute(0, 2, 1, 3)[pages, within] = values
    return k, v


class Mismatch(NamedTuple):
    which: str  # "k" or "v"
    page: int
    slot: int
    head: int
    appended: bool  # an appended slot holding wrong bytes (else a canary that was overwritten)


class AppendVerdict(NamedTuple):
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
    """Byte-for-byte comparison of the pools a kernel left with ``expected_pools``."""
    want_k, want_v = expected_pools(case, before)
    intended = torch.zeros(case.num_pages, case.page_size, dtype=torch.bool)
    slots = before.slot_mapping.cpu()
    intended[slots // case.page_size, slots % case.page_size] = True
    found: list[Mismatch] = []
    count = 0
    for which, want, got in (("k", want_k, k_after.cpu()), ("v", want_v, v_after.cpu())):
        diff = raw_bits(want) != raw_bits(got)
        rows = diff.any(-1)  # [pages, page, H] or [pages, H, page]
        if case.kv_layout == "HND":
            rows = rows.transpose(1, 2)
        where = rows.nonzero().tolist()
        count += len(where)
        found += [Mismatch(which, p, s, h, bool(intended[p, s])) for p, s, h in where[: limit - len(found)]]
    return AppendVerdict(count == 0, tuple(found), count)
