"""The case model: one serializable, validated description of a batched paged-attention call.

Semantics (every backend adapter converts *from* these, the oracle follows them exactly):

* Layout is FlashInfer-style CSR. Request ``b`` owns pages
  ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (physical ids into a pool of ``num_pages`` pages of
  ``page_size`` slots, NHD); its last page holds ``kv_last_page_len[b]`` tokens (0 only for a
  request with no pages). Its queries are rows ``qo_indptr[b]:qo_indptr[b+1]``.
* Bottom-right alignment: query ``i`` of a request with ``qo_len`` queries and ``kv_len`` keys sits
  at absolute position ``kv_len - qo_len + i``; key ``j`` sits at position ``j``.
* ``causal``: a query at position ``p`` attends keys ``j <= p``. ``window_left >= 0``: it attends
  keys ``j >= p - window_left`` (FlashInfer's convention: the window spans ``window_left + 1``
  tokens ending at the query); ``-1`` is off.
* Logit of query ``q`` and key ``k`` in qo head ``h`` (kv head ``h // group``)::

      s = sm_scale * q.k ;  s = cap * tanh(s / cap) if cap > 0 ;  s += -alibi_slope[h] * |p - j|

  then masked keys are dropped. ``sinks[h]`` adds ``exp(sinks[h])`` to the softmax denominator
  only; the returned LSE is ``log(sum_j exp(s_j))`` over the attended keys (without the sink).
* A query row with no key to attend has output exactly 0 and LSE exactly ``-inf``.
* fp8 KV: the cache stores ``round(k / k_scale)`` in the fp8 dtype; the value is
  ``stored * k_scale`` (likewise V with ``v_scale``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

Q_DTYPES = ("float16", "bfloat16", "float32")
KV_DTYPES = Q_DTYPES + ("float8_e4m3fn", "float8_e5m2")
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
DISTRIBUTIONS = ("normal", "peaked", "outliers", "near_ties", "exact")


class CaseError(ValueError):
    """An invalid case: the message names the field (and request) at fault."""


@dataclass(frozen=True)
class Layout:
    """Batch layout in canonical CSR form (see the module docstring)."""

    qo_indptr: tuple[int, ...]
    kv_indptr: tuple[int, ...]
    kv_indices: tuple[int, ...]
    kv_last_page_len: tuple[int, ...]
    page_size: int
    num_pages: int

    def __post_init__(self) -> None:
        for name in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"):
            object.__setattr__(self, name, tuple(int(x) for x in getattr(self, name)))
        _validate_layout(self)

    @property
    def batch_size(self) -> int:
        return len(self.qo_indptr) - 1

    @cached_property
    def qo_lens(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.qo_indptr, self.qo_indptr[1:]))

    @cached_property
    def num_pages_per_request(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.kv_indptr, self.kv_indptr[1:]))

    @cached_property
    def kv_lens(self) -> tuple[int, ...]:
        return tuple(
            0 if n == 0 else (n - 1) * self.page_size + last
            for n, last in zip(self.num_pages_per_request, self.kv_last_page_len)
        )

    @property
    def total_q(self) -> int:
        return self.qo_indptr[-1]

    def pages_of(self, request: int) -> tuple[int, ...]:
        return self.kv_indices[self.kv_indptr[request] : self.kv_indptr[request + 1]]

    def block_table(self, pad: int = 0) -> list[list[int]]:
        """vLLM / flash-attn style 2-D block table, rows padded with ``pad``."""
        width = max(self.num_pages_per_request, default=0)
        return [list(self.pages_of(b)) + [pad] * (width - n) for b, n in enumerate(self.num_pages_per_request)]

    def request_of_row(self, row: int) -> int:
        """The request that owns query row ``row``."""
        for b in range(self.batch_size):
            if row < self.qo_indptr[b + 1]:
                return b
        raise IndexError(f"query row {row} out of range (total_q={self.total_q})")

    def position_of_row(self, row: int) -> int:
        """Absolute position of query row ``row`` (bottom-right alignment, may be negative)."""
        b = self.request_of_row(row)
        return self.kv_lens[b] - self.qo_lens[b] + (row - self.qo_indptr[b])

    def slot_of(self, request: int, position: int) -> tuple[int, int] | None:
        """(physical page, slot) holding key ``position`` of ``request``; None if outside."""
        if not 0 <= position < self.kv_lens[request]:
            return None
        return self.pages_of(request)[position // self.page_size], position % self.page_size

    @classmethod
    def from_lengths(
        cls,
        qo_lens: list[int],
        kv_lens: list[int],
        page_size: int,
        *,
        page_order: list[int] | None = None,
        extra_pages: int = 0,
    ) -> Layout:
        """Build a layout from per-request lengths.

        Pages are handed out in ``page_order`` (a permutation of the pool; identity if None);
        the pool has ``extra_pages`` pages that no request references.
        """
        if len(qo_lens) != len(kv_lens):
            raise CaseError(f"qo_lens has {len(qo_lens)} requests but kv_lens has {len(kv_lens)}")
        pages_needed = [-(-n // page_size) for n in kv_lens]
        num_pages = sum(pages_needed) + extra_pages
        order = list(range(num_pages)) if page_order is None else list(page_order)
        if sorted(order) != list(range(num_pages)):
            raise CaseError(f"page_order must be a permutation of range({num_pages})")
        kv_indptr, kv_indices, last = [0], [], []
        for n_pages, kv_len in zip(pages_needed, kv_lens):
            kv_indices += order[kv_indptr[-1] : kv_indptr[-1] + n_pages]
            kv_indptr.append(kv_indptr[-1] + n_pages)
            last.append(0 if kv_len == 0 else (kv_len - 1) % page_size + 1)
        qo_indptr = [0]
        for n in qo_lens:
            qo_indptr.append(qo_indptr[-1] + n)
        return cls(tuple(qo_indptr), tuple(kv_indptr), tuple(kv_indices), tuple(last), page_size, num_pages)


def _validate_indptr(name: str, indptr: tuple[int, ...]) -> None:
    if len(indptr) < 2:
        raise CaseError(f"{name} must have batch_size + 1 >= 2 entries, got {len(indptr)}")
    if indptr[0] != 0:
        raise CaseError(f"{name}[0] must be 0, got {indptr[0]}")
    for b, (lo, hi) in enumerate(zip(indptr, indptr[1:])):
        if hi < lo:
            raise CaseError(f"{name} is not monotone at request {b}: {name}[{b}]={lo} > {name}[{b + 1}]={hi}")


def _validate_layout(layout: Layout) -> None:
    if layout.page_size < 1:
        raise CaseError(f"page_size must be >= 1, got {layout.page_size}")
    _validate_indptr("qo_indptr", layout.qo_indptr)
    _validate_indptr("kv_indptr", layout.kv_indptr)
    batch = len(layout.qo_indptr) - 1
    if len(layout.kv_indptr) != batch + 1:
        raise CaseError(f"kv_indptr has {len(layout.kv_indptr) - 1} requests but qo_indptr has {batch}")
    if len(layout.kv_last_page_len) != batch:
        raise CaseError(f"kv_last_page_len has {len(layout.kv_last_page_len)} entries, expected batch_size={batch}")
    if len(layout.kv_indices) != layout.kv_indptr[-1]:
        raise CaseError(f"kv_indices has {len(layout.kv_indices)} entries but kv_indptr[-1]={layout.kv_indptr[-1]}")
    owner: dict[int, int] = {}
    for b in range(batch):
        n_pages = layout.kv_indptr[b + 1] - layout.kv_indptr[b]
        last = layout.kv_last_page_len[b]
        if n_pages == 0 and last != 0:
            raise CaseError(f"kv_last_page_len[{b}]={last} but request {b} has no pages (must be 0)")
        if n_pages > 0 and not 1 <= last <= layout.page_size:
            raise CaseError(
                f"kv_last_page_len[{b}]={last} out of range 1..page_size={layout.page_size} for request {b}"
            )
        for page in layout.kv_indices[layout.kv_indptr[b] : layout.kv_indptr[b + 1]]:
            if not 0 <= page < layout.num_pages:
                raise CaseError(f"kv_indices: page id {page} of request {b} out of range 0..{layout.num_pages - 1}")
            if page in owner:
                raise CaseError(f"kv_indices: page {page} is used twice (requests {owner[page]} and {b})")
            owner[page] = b


@dataclass(frozen=True)
class Heads:
    num_qo_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_vo: int

    def __post_init__(self) -> None:
        for name in ("num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo"):
            if getattr(self, name) < 1:
                raise CaseError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_qo_heads % self.num_kv_heads:
            raise CaseError(
                f"num_qo_heads={self.num_qo_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )

    @property
    def group_size(self) -> int:
        return self.num_qo_heads // self.num_kv_heads


@dataclass(frozen=True)
class Options:
    """Attention options; every default is the neutral value (the option is off)."""

    causal: bool = False
    sm_scale: float | None = None  # None: 1 / sqrt(head_dim_qk)
    window_left: int = -1
    logits_soft_cap: float = 0.0
    alibi_slopes: tuple[float, ...] | None = None  # one per qo head
    sinks: tuple[float, ...] | None = None  # one per qo head
    q_dtype: str = "float32"  # also the output dtype
    kv_dtype: str = "float32"
    k_scale: float = 1.0
    v_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("alibi_slopes", "sinks"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(float(x) for x in getattr(self, name)))
        if self.q_dtype not in Q_DTYPES:
            raise CaseError(f"q_dtype must be one of {Q_DTYPES}, got {self.q_dtype!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise CaseError(f"kv_dtype must be one of {KV_DTYPES}, got {self.kv_dtype!r}")
        if self.window_left < -1:
            raise CaseError(f"window_left must be -1 (off) or >= 0, got {self.window_left}")
        if not (self.logits_soft_cap >= 0 and math.isfinite(self.logits_soft_cap)):
            raise CaseError(f"logits_soft_cap must be finite and >= 0, got {self.logits_soft_cap}")
        if self.sm_scale is not None and not (math.isfinite(self.sm_scale) and self.sm_scale > 0):
            raise CaseError(f"sm_scale must be finite and > 0, got {self.sm_scale}")
        for name in ("k_scale", "v_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise CaseError(f"{name} must be finite and > 0, got {value}")
            if value != 1.0 and self.kv_dtype not in FP8_DTYPES:
                raise CaseError(f"{name}={value} needs an fp8 kv_dtype, got {self.kv_dtype}")

    @property
    def is_fp8(self) -> bool:
        return self.kv_dtype in FP8_DTYPES


@dataclass(frozen=True)
class Case:
    """A complete paged-attention call: layout, heads, options and how to make its tensors.

    Tensors come from ``seed`` and the named data ``distribution`` (``oracle.tensors``), or from
    an npz sidecar named by ``tensors_file`` (relative to the case file).
    """

    layout: Layout
    heads: Heads
    options: Options = field(default_factory=Options)
    seed: int = 0
    distribution: str = "normal"
    tensors_file: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise CaseError(f"distribution must be one of {DISTRIBUTIONS}, got {self.distribution!r}")
        for name in ("alibi_slopes", "sinks"):
            values = getattr(self.options, name)
            if values is not None and len(values) != self.heads.num_qo_heads:
                raise CaseError(f"{name} has {len(values)} entries, expected num_qo_heads={self.heads.num_qo_heads}")

    @property
    def sm_scale(self) -> float:
        return self.options.sm_scale if self.options.sm_scale is not None else 1.0 / math.sqrt(self.heads.head_dim_qk)

    def replace(self, **changes: Any) -> Case:
        return dataclasses.replace(self, **changes)

    @property
    def case_id(self) -> str:
        """Short stable hash of everything that defines the case."""
        body = json.dumps(_case_body(self), sort_keys=True).encode()
        return hashlib.sha256(body).hexdigest()[:12]

    def summary(self) -> str:
        lay, h, o = self.layout, self.heads, self.options
        flags = [name for name in ("causal",) if getattr(o, name)]
        if o.window_left >= 0:
            flags.append(f"window_left={o.window_left}")
        if o.logits_soft_cap:
            flags.append(f"soft_cap={o.logits_soft_cap:g}")
        if o.alibi_slopes:
            flags.append("alibi")
        if o.sinks:
            flags.append("sinks")
        if o.is_fp8:
            flags.append(f"k_scale={o.k_scale:g} v_scale={o.v_scale:g}")
        return (
            f"B={lay.batch_size} qo_lens={list(lay.qo_lens)} kv_lens={list(lay.kv_lens)} page={lay.page_size} "
            f"heads={h.num_qo_heads}/{h.num_kv_heads} dims={h.head_dim_qk}/{h.head_dim_vo} "
            f"q={o.q_dtype} kv={o.kv_dtype} {self.distribution} seed={self.seed} {' '.join(flags)}".rstrip()
        )

    # --- serialization -------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "case_id": self.case_id, **_case_body(self), "meta": self.meta}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Case:
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise CaseError(f"unknown case schema_version {version!r}; this version reads {SCHEMA_VERSION}")
        known = {"schema_version", "case_id", "layout", "heads", "options", "seed", "distribution", "tensors_file", "meta"}
        unknown = set(data) - known
        if unknown:
            raise CaseError(f"unknown case fields {sorted(unknown)}")
        try:
            case = cls(
                layout=Layout(**data["layout"]),
                heads=Heads(**data["heads"]),
                options=Options(**data.get("options", {})),
                seed=int(data.get("seed", 0)),
                distribution=data.get("distribution", "normal"),
                tensors_file=data.get("tensors_file"),
                meta=dict(data.get("meta", {})),
            )
        except KeyError as exc:
            raise CaseError(f"case file is missing field {exc}") from None
        except TypeError as exc:
            raise CaseError(f"malformed case file: {exc}") from None
        if "case_id" in data and data["case_id"] != case.case_id and case.tensors_file is None:
            raise CaseError(f"case_id {data['case_id']} does not match the case's content ({case.case_id})")
        return case

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Case:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise CaseError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise CaseError(f"{path}: a case file holds a JSON object")
        case = cls.from_json(data)
        if case.tensors_file is not None:
            case = case.replace(tensors_file=str((path.parent / case.tensors_file).resolve()))
        return case


def _case_body(case: Case) -> dict[str, Any]:
    return {
        "layout": dataclasses.asdict(case.layout),
        "heads": dataclasses.asdict(case.heads),
        "options": dataclasses.asdict(case.options),
        "seed": case.seed,
        "distribution": case.distribution,
        "tensors_file": case.tensors_file,
    }
