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

  (``soft_cap_alibi_order="cap-then-alibi"``, the default: flash-attn's order; ``"alibi-then-cap"``
  adds the bias before capping, FlashInfer's order in ``variants.cuh``), then masked keys are dropped. ``sinks[h]`` adds ``exp(sinks[h])`` to the softmax denominator
  only; the returned LSE is ``log(sum_j exp(s_j))`` over the attended keys (without the sink).
* A query row with no key to attend has output exactly 0 and LSE exactly ``-inf``.
* ``rope`` (``Rope``, optional): q and k are rotated by their absolute positions (above) before
  the dot product, in exact arithmetic; V is not (``pa_oracle.oracle.rope``).
* ``positions`` (optional, RoPE cases only): per request the RoPE position of each query, in place of
  ``kv_len - qo_len + i``: EAGLE and Medusa verify a draft tree with node ``n`` at ``prefix + depth(n)``.
  The last ``qo_len`` keys of a request are its queries' own keys and rotate at their queries' positions;
  earlier keys at their index ``j``. They move RoPE only: causal, the window, ALiBi and the custom mask
  stay by index. Positions equal to the index ones are no positions (``None``: one case, one id).
* fp8 KV: the cache stores ``round(k / k_scale)`` in the fp8 dtype; the value is
  ``stored * k_scale`` (likewise V with ``v_scale``).
* fp8 q (``q_dtype`` in ``FP8_DTYPES``): q is stored as ``round(q / q_scale)`` in that dtype, its value
  ``stored * q_scale``; the output is in ``o_dtype`` (16 or 32 bits, required for an fp8 q). An MLA q is one
  row ``[q_nope | q_pe]`` under one per-tensor ``q_scale``, both parts quantised once, as the engines that run
  MLA with an fp8 q do: vLLM's ``MLAAttention`` quantises the concatenation (``_decode_concat_quant_fp8_op(
  mqa_ql_nope, mqa_q_pe, self._q_scale)``, per tensor) and FlashMLA dequantises it by ``descale_q=layer._q_scale``;
  SGLang 0.5.10.post1 (``flashmla_backend.py``) ``scaled_fp8_quant(reshape_q_2d, q_scale)`` of the whole 576-dim
  row, then ``descale_q``; FlashInfer 0.6.18.post1's ``trtllm_batch_decode_with_kv_cache_mla`` and
  ``xqa_batch_decode_with_kv_cache_mla`` take the concatenated fp8 query with ``bmm1_scale = q_scale * k_scale *
  sm_scale``. (Its ``BatchMLAPagedAttentionWrapper`` takes no q scale: fp8 there is the latent cache alone.)
* ``custom_mask`` (``CustomMask``, optional): per request a boolean ``[qo_len, kv_len]`` matrix,
  row ``i`` the request's query ``i``, column ``j`` its key ``j`` (so bottom-right aligned like
  every other mask). It is ANDed with ``causal`` and the window: a key is attended iff the mask,
  the causal test (if on) and the window test (if on) all allow it. Logit terms (soft cap, ALiBi)
  and sinks are unchanged; a row the combination leaves without keys is an empty row (out 0,
  LSE -inf, the sink does not matter). A draft tree (``tree_parents``) is the mask of speculative
  decoding: each query is a tree node whose key is one of the request's last ``qo_len`` keys; it
  attends every earlier (prefix) key, itself and its ancestors. A chain is the causal mask.
* MLA (``Heads.mla``): one latent KV head; the cache row is ``[ckv | kpe]`` of ``head_dim_qk``
  dims and V is a view of its first ``head_dim_vo`` (``d_ckv``) dims (``v_cache`` is
  ``k_cache[..., :head_dim_vo]``). q's first ``d_ckv`` dims are ``q_nope`` (absorbed), the rest
  ``q_pe``. The attention math is MQA's: ``s = sm_scale * (q_nope.ckv + q_pe.kpe)``. With ``rope``
  (DeepSeek's split) only ``q_pe`` and ``kpe`` rotate (``Rope.span``: ``rotary_dim`` counts within the
  ``d_kpe`` dims); ``q_nope``, ``ckv`` and so V never do.
* ``storage`` (``Storage``, optional): where the tensors lie in memory (combined K/V, HND pages, q a
  view of a fused QKV buffer, caches at an offset in a larger pool). It changes addresses only, never
  a value or the meaning above: indexing is always as if NHD.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from pa_oracle.oracle.errors import BadInput
from pa_oracle.oracle.schema import convert, file_fields

SCHEMA_VERSION = 1

# Bounds of every number a case holds, so that no value is silently wrong in some kernel:
INT32_MAX = 2**31 - 1  # lengths, page ids, page_size, heads, dims and window_left index int32 tensors in the kernels
SEED_LIMIT = 2**63  # seeds 0..2**63-1: torch.Generator.manual_seed takes them (and seed + 1) without wrapping
# sm_scale, k_scale, v_scale: models use 1/sqrt(head_dim) (>= 2e-5 for any int32 head_dim) or a small multiple of
# it; within [1e-6, 1e3] the scaled logits and the fp8 codes k / k_scale stay finite and normal in float32 (1e308
# made inf logits, and so a correct kernel "fail"), below 1e-6 every logit is ~0 (no signal)
SCALE_RANGE = (1e-6, 1e3)
CAP_THEN_ALIBI, ALIBI_THEN_CAP = "cap-then-alibi", "alibi-then-cap"
SOFT_CAP_ALIBI_ORDERS = (CAP_THEN_ALIBI, ALIBI_THEN_CAP)  # the first is the default (omitted from the JSON)
SOFT_CAP_RANGE = (1e-6, 1e6)  # logits_soft_cap when on (0 is off): models use 30-50; outside this range float32
# s / cap or cap * tanh(.) leaves the normal range and a kernel's capped logit differs from the oracle's
PER_HEAD_LIMIT = 1e3  # |ALiBi slope| and |sink|: model slopes lie in (0, 1] and sinks within +-10
ROPE_STYLES = ("neox", "interleaved")  # rotate halves (GPT-NeoX, Llama in HF, FlashInfer) / adjacent pairs (GPT-J)
ROPE_THETA_RANGE = (1.0, 1e12)  # models use 1e4 (Llama 2), 5e5 (Llama 3), 1e6 (Qwen 2), 1e7
ROPE_SCALE_RANGE = (1e-3, 1e6)  # linear position interpolation: positions are divided by it

Q_DTYPES = ("float16", "bfloat16", "float32")
KV_DTYPES = Q_DTYPES + ("float8_e4m3fn", "float8_e5m2")
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
DISTRIBUTIONS = ("normal", "peaked", "outliers", "near_ties", "exact")


class CaseError(BadInput):
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
            object.__setattr__(self, name, _ints(name, getattr(self, name)))
        for name in ("page_size", "num_pages"):
            object.__setattr__(self, name, _int(name, getattr(self, name), 0, INT32_MAX))
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

    def subset(self, requests: list[int]) -> Layout:
        """``requests`` (in that order) as a batch of their own: their own page ids, the same pool."""
        qo, kv = [0], [0]
        indices: list[int] = []
        for b in requests:
            pages = self.pages_of(b)
            qo.append(qo[-1] + self.qo_lens[b])
            kv.append(kv[-1] + len(pages))
            indices += pages
        return Layout(tuple(qo), tuple(kv), tuple(indices), tuple(self.kv_last_page_len[b] for b in requests),
                      self.page_size, self.num_pages)

    def rows_of(self, requests: list[int]) -> list[int]:
        """The query rows of ``requests``, in that order."""
        return [row for b in requests for row in range(self.qo_indptr[b], self.qo_indptr[b + 1])]

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


def _int(name: str, value: Any, low: int, high: int, why: str = "int32") -> int:
    """``value`` as an int (numpy ints too; never a bool, float or str) within ``low..high``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise CaseError(f"{name}: expected int, got {type(value).__name__} {_brief(value)}")
    value = int(value)
    if value < low:
        raise CaseError(f"{name} must be >= {low}, got {_brief(value)}")
    if value > high:
        raise CaseError(f"{name} must be <= {high} ({why}), got {_brief(value)}")
    return value


def _brief(value: Any) -> str:
    """``value`` for a message: a 400-digit int is shown by its first digits and its length."""
    text = repr(value)
    return text if len(text) <= 30 else f"{text[:12]}... ({len(text)} characters)"


def _ints(name: str, values: Any) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise CaseError(f"{name}: expected a list of int, got {type(values).__name__} {_brief(values)}")
    return tuple(_int(f"{name}[{i}]", x, -INT32_MAX - 1, INT32_MAX) for i, x in enumerate(values))


def _real(name: str, value: Any, low: float, high: float) -> float:
    """``value`` as a finite float within ``low..high`` (an int is accepted, a bool or str is not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise CaseError(f"{name}: expected a number, got {type(value).__name__} {_brief(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise CaseError(f"{name} must be finite, got {_brief(value)}")
    if not low <= number <= high:
        raise CaseError(f"{name} must be in [{low:g}, {high:g}], got {_brief(value)}")
    return number


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
    mla: bool = False  # the latent layout: V is the first head_dim_vo dims of the one K head

    def __post_init__(self) -> None:
        for name in ("num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo"):
            object.__setattr__(self, name, _int(name, getattr(self, name), 1, INT32_MAX))
        if self.num_qo_heads % self.num_kv_heads:
            raise CaseError(
                f"num_qo_heads={self.num_qo_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if not isinstance(self.mla, bool):
            raise CaseError(f"mla: expected bool, got {type(self.mla).__name__} {_brief(self.mla)}")
        if self.mla and self.num_kv_heads != 1:
            raise CaseError(f"mla: the latent cache has one KV head, got num_kv_heads={self.num_kv_heads}")
        if self.mla and not self.head_dim_vo < self.head_dim_qk:
            raise CaseError(
                f"mla: head_dim_vo (d_ckv) must be < head_dim_qk (d_ckv + d_kpe), got {self.head_dim_vo} and {self.head_dim_qk}"
            )

    @property
    def d_ckv(self) -> int:
        """MLA: the latent (``q_nope``, V) dims."""
        return self.head_dim_vo

    @property
    def d_kpe(self) -> int:
        """MLA: the rope (``q_pe``) dims."""
        return self.head_dim_qk - self.head_dim_vo

    @property
    def group_size(self) -> int:
        return self.num_qo_heads // self.num_kv_heads


@dataclass(frozen=True)
class Rope:
    """Rotary position embedding applied to q and k inside the kernel (``pa_oracle.oracle.rope``).

    A query or key at absolute position ``p`` (module docstring) has each pair ``(x_a, x_b)`` of its
    first ``rotary_dim`` dims rotated by the angle ``(p / scale) * theta ** (-2 i / rotary_dim)``,
    ``i`` the pair's index: ``style="neox"`` pairs dim ``i`` with ``i + rotary_dim / 2``,
    ``"interleaved"`` pairs ``2 i`` with ``2 i + 1``. Dims from ``rotary_dim`` on are not rotated;
    ``rotary_dim=None`` is the whole ``head_dim_qk``.
    """

    style: str = "neox"
    theta: float = 1e4
    scale: float = 1.0
    rotary_dim: int | None = None

    def __post_init__(self) -> None:
        if self.style not in ROPE_STYLES:
            raise CaseError(f"style must be one of {ROPE_STYLES}, got {_brief(self.style)}")
        _real("theta", self.theta, *ROPE_THETA_RANGE)
        _real("scale", self.scale, *ROPE_SCALE_RANGE)
        if self.rotary_dim is not None and _int("rotary_dim", self.rotary_dim, 0, INT32_MAX) % 2:
            raise CaseError(f"rotary_dim must be even (dims rotate in pairs), got {self.rotary_dim}")

    def dims(self, head_dim: int) -> int:
        """How many leading dims of a ``head_dim`` head rotate."""
        return head_dim if self.rotary_dim is None else self.rotary_dim

    def span(self, heads: Heads) -> tuple[int, int]:
        """The ``[start, stop)`` dims of a q or K row that rotate: the first ``dims(head_dim_qk)``; for MLA the
        first ``dims(d_kpe)`` of the rope part ``q_pe`` / ``kpe`` (from ``d_ckv`` on), never ``q_nope`` / ``ckv``."""
        start = heads.d_ckv if heads.mla else 0
        return start, start + self.dims(heads.head_dim_qk - start)


@dataclass(frozen=True)
class Options:
    """Attention options; every default is the neutral value (the option is off)."""

    causal: bool = False
    sm_scale: float | None = None  # None: 1 / sqrt(head_dim_qk)
    window_left: int = -1
    logits_soft_cap: float = 0.0
    alibi_slopes: tuple[float, ...] | None = None  # one per qo head
    sinks: tuple[float, ...] | None = None  # one per qo head
    q_dtype: str = "float32"  # also the output dtype, unless q is fp8 (then ``o_dtype``)
    kv_dtype: str = "float32"
    k_scale: float = 1.0
    v_scale: float = 1.0
    soft_cap_alibi_order: str = CAP_THEN_ALIBI  # which comes first when both are on (SOFT_CAP_ALIBI_ORDERS)
    rope: Rope | None = None  # rotary embedding of q and k (None: off, omitted from the JSON)
    # an fp8 q (issue 15): its scale and the output dtype; 1.0 / None otherwise, omitted from the JSON
    q_scale: float = 1.0
    o_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.rope is not None and not isinstance(self.rope, Rope):
            raise CaseError(f"rope: expected a Rope or null, got {type(self.rope).__name__} {_brief(self.rope)}")
        for name in ("alibi_slopes", "sinks"):
            values = getattr(self, name)
            if values is not None:
                if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
                    raise CaseError(f"{name}: expected a list of numbers, got {type(values).__name__} {_brief(values)}")
                checked = (_real(f"{name}[{h}]", x, -PER_HEAD_LIMIT, PER_HEAD_LIMIT) for h, x in enumerate(values))
                object.__setattr__(self, name, tuple(checked))
        if not isinstance(self.causal, bool):
            raise CaseError(f"causal: expected bool, got {type(self.causal).__name__} {_brief(self.causal)}")
        if self.q_dtype not in Q_DTYPES + FP8_DTYPES:
            raise CaseError(f"q_dtype must be one of {Q_DTYPES + FP8_DTYPES}, got {_brief(self.q_dtype)}")
        self._check_fp8_q()
        if self.kv_dtype not in KV_DTYPES:
            raise CaseError(f"kv_dtype must be one of {KV_DTYPES}, got {_brief(self.kv_dtype)}")
        if _int("window_left", self.window_left, -INT32_MAX - 1, INT32_MAX) < -1:
            raise CaseError(f"window_left must be -1 (off) or >= 0, got {self.window_left}")
        # the checks keep the number as given (an int stays an int), so case_id does not change
        cap = _real("logits_soft_cap", self.logits_soft_cap, 0.0, SOFT_CAP_RANGE[1])
        if 0 < cap < SOFT_CAP_RANGE[0]:
            low, high = SOFT_CAP_RANGE
            raise CaseError(f"logits_soft_cap must be 0 (off) or in [{low:g}, {high:g}], got {self.logits_soft_cap}")
        if self.soft_cap_alibi_order not in SOFT_CAP_ALIBI_ORDERS:
            raise CaseError(f"soft_cap_alibi_order must be one of {SOFT_CAP_ALIBI_ORDERS}, got {_brief(self.soft_cap_alibi_order)}")
        if self.sm_scale is not None:
            _real("sm_scale", self.sm_scale, *SCALE_RANGE)
        for name in ("k_scale", "v_scale"):
            value = getattr(self, name)
            _real(name, value, *SCALE_RANGE)
            if value != 1.0 and self.kv_dtype not in FP8_DTYPES:
                raise CaseError(f"{name}={value} needs an fp8 kv_dtype, got {self.kv_dtype}")

    def _check_fp8_q(self) -> None:
        _real("q_scale", self.q_scale, *SCALE_RANGE)
        if not self.q_is_fp8:
            if self.q_scale != 1.0:
                raise CaseError(f"q_scale={self.q_scale} needs an fp8 q_dtype, got {self.q_dtype}")
            if self.o_dtype is not None:
                raise CaseError(f"o_dtype is set only for an fp8 q (the output is in q's dtype {self.q_dtype}), got {_brief(self.o_dtype)}")
            return
        if self.o_dtype not in Q_DTYPES:
            raise CaseError(f"o_dtype: an fp8 q needs an output dtype in {Q_DTYPES}, got {_brief(self.o_dtype)}")
        if self.kv_dtype not in FP8_DTYPES:
            raise CaseError(f"kv_dtype: an fp8 q takes an fp8 KV (fp8 tensor cores), got {self.kv_dtype}")
        if self.rope is not None:
            raise CaseError("rope: RoPE of an fp8 q is not modelled")

    @property
    def is_fp8(self) -> bool:
        """True for an fp8 KV cache (an fp8 q has one too: ``q_is_fp8``)."""
        return self.kv_dtype in FP8_DTYPES

    @property
    def q_is_fp8(self) -> bool:
        return self.q_dtype in FP8_DTYPES

    @property
    def out_dtype(self) -> str:
        """The dtype of the output: q's, or ``o_dtype`` for an fp8 q."""
        return self.o_dtype if self.o_dtype is not None else self.q_dtype

    @property
    def alibi_before_soft_cap(self) -> bool:
        """True when both are on and the bias is added before capping (the order matters only then)."""
        both = self.logits_soft_cap > 0 and self.alibi_slopes is not None
        return both and self.soft_cap_alibi_order == ALIBI_THEN_CAP


@dataclass(frozen=True)
class CustomMask:
    """Per-request boolean masks (module docstring), given one of two ways:

    * ``tree_parents``: per request one parent per query, ``-1`` for a root (it attends the
      prefix only, and itself) or the index ``< i`` of an earlier query of the same request;
    * ``bits``: every request's ``[qo_len, kv_len]`` mask flattened row-major, requests one after
      another, as one bit string packed little-endian (bit ``t`` is bit ``t % 8`` of byte
      ``t // 8``, numpy ``packbits(bitorder="little")``), base64; the padding bits are 0.
    """

    tree_parents: tuple[tuple[int, ...], ...] | None = None
    bits: str | None = None

    def __post_init__(self) -> None:
        if (self.tree_parents is None) == (self.bits is None):
            raise CaseError("custom_mask: give exactly one of tree_parents and bits")
        if self.tree_parents is not None:
            if isinstance(self.tree_parents, (str, bytes)) or not isinstance(self.tree_parents, Iterable):
                raise CaseError(f"custom_mask.tree_parents: expected a list of lists, got {_brief(self.tree_parents)}")
            parents = tuple(_ints(f"custom_mask.tree_parents[{b}]", p) for b, p in enumerate(self.tree_parents))
            for b, p in enumerate(parents):
                for i, parent in enumerate(p):
                    if not -1 <= parent < i:
                        raise CaseError(f"custom_mask.tree_parents[{b}][{i}]={parent}: a parent is -1 (root) or an earlier query 0..{i - 1}")
            object.__setattr__(self, "tree_parents", parents)
        elif not isinstance(self.bits, str):
            raise CaseError(f"custom_mask.bits: expected a base64 str, got {type(self.bits).__name__}")

    @classmethod
    def from_dense(cls, masks: list[np.ndarray]) -> CustomMask:
        """The ``bits`` form of per-request boolean ``[qo_len, kv_len]`` arrays."""
        flat = np.concatenate([np.asarray(m, dtype=bool).reshape(-1) for m in masks] or [np.zeros(0, bool)])
        return cls(bits=base64.b64encode(np.packbits(flat, bitorder="little").tobytes()).decode())

    def dense(self, layout: Layout) -> list[np.ndarray]:
        """Per request the boolean ``[qo_len, kv_len]`` mask (before causal and window)."""
        qo_lens, kv_lens = layout.qo_lens, layout.kv_lens
        if self.tree_parents is not None:
            if len(self.tree_parents) != layout.batch_size:
                raise CaseError(f"custom_mask.tree_parents has {len(self.tree_parents)} requests, the layout {layout.batch_size}")
            masks = []
            for b, (parents, qo, kv) in enumerate(zip(self.tree_parents, qo_lens, kv_lens)):
                if len(parents) != qo:
                    raise CaseError(f"custom_mask.tree_parents[{b}] has {len(parents)} nodes, request {b} has qo_len {qo}")
                if qo > kv:
                    raise CaseError(f"custom_mask.tree_parents[{b}]: the tree's {qo} nodes need qo_len <= kv_len, got kv_len {kv}")
                mask = np.zeros((qo, kv), dtype=bool)
                mask[:, : kv - qo] = True
                for i, parent in enumerate(parents):
                    mask[i, kv - qo + i] = True
                    if parent >= 0:
                        mask[i, kv - qo :] |= mask[parent, kv - qo :]
                masks.append(mask)
            return masks
        assert self.bits is not None
        sizes = [q * k for q, k in zip(qo_lens, kv_lens)]
        total = sum(sizes)
        try:
            raw = base64.b64decode(self.bits, validate=True)
        except (binascii.Error, ValueError):
            raise CaseError("custom_mask.bits: not valid base64") from None
        if len(raw) != -(-total // 8):
            raise CaseError(f"custom_mask.bits: {len(raw)} bytes, the layout's masks need {-(-total // 8)} ({total} bits)")
        flat = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
        if flat[total:].any():
            raise CaseError("custom_mask.bits: the padding bits after the last mask must be 0")
        starts = np.cumsum([0, *sizes])
        return [flat[a:e].astype(bool).reshape(q, k) for a, e, q, k in zip(starts, starts[1:], qo_lens, kv_lens)]

    def as_json(self) -> dict[str, Any]:
        if self.tree_parents is not None:
            return {"tree_parents": [list(p) for p in self.tree_parents]}
        return {"bits": self.bits}


def flashinfer_packed_mask(masks: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """FlashInfer's ``packed_custom_mask`` and ``mask_indptr``: each request's mask flattened
    row-major and packed little-endian on its own (``segment_packbits``), byte offsets per request."""
    packed = [np.packbits(np.asarray(m, dtype=bool).reshape(-1), bitorder="little") for m in masks]
    indptr = np.cumsum([0, *(len(p) for p in packed)]).astype(np.int32)
    return (np.concatenate(packed) if packed else np.zeros(0, np.uint8)).astype(np.uint8), indptr


KV_STORAGES = ("separate", "combined")
KV_LAYOUTS = ("NHD", "HND")
Q_STORAGES = ("contiguous", "fused_qkv")
STORAGE_FEATURES = ("contiguous", "combined", "HND", "fused_qkv", "pool_offset")  # "contiguous": the default storage
# strided pools, drawn only for a kernel that declares them (so no other kernel's draws change): a page stride
# beyond the dense page (padded pages, one layer of a cross-layer pool) and a head-dim stride beyond 1
STRIDE_STORAGES = ("padded_pages", "cross_layer", "dim_stride")
ALL_STORAGE_FEATURES = STORAGE_FEATURES + STRIDE_STORAGES
POOL_OFFSET_MULTIPLE, POOL_OFFSET_LIMIT = 64, 1 << 20  # 64 elements: every row stays 16-byte aligned (vector loads)
LAYERS_LIMIT, DIM_STRIDE_LIMIT = 64, 8  # a cross-layer pool allocates every layer: kept small


@dataclass(frozen=True)
class Storage:
    """How the case's tensors lie in memory; the values never depend on it (``pa_oracle.oracle.tensors``).

    * ``kv``: ``"separate"`` K and V tensors, or ``"combined"``: one ``[num_pages, 2, ...]`` tensor, K at
      ``[:, 0]`` and V at ``[:, 1]`` (vLLM's and FlashInfer's single ``paged_kv_cache``; needs
      ``head_dim_qk == head_dim_vo``).
    * ``kv_layout``: ``"NHD"`` pages ``[page_size, heads, dim]`` or ``"HND"`` ``[heads, page_size, dim]``.
    * ``q``: ``"contiguous"``, or ``"fused_qkv"``: q is a strided view of the first ``Hq * Dqk`` columns of a
      ``[total_q, Hq * Dqk + Hkv * (Dqk + Dvo)]`` projection buffer (MLA: ``(Hq + 1) * Dqk``) whose other
      columns are poison.
    * ``pool_offset``: the caches start this many elements into a larger buffer (a multiple of
      ``POOL_OFFSET_MULTIPLE``); the elements before and after them are poison.
    * ``page_padding``: poison elements after each page (a multiple of ``POOL_OFFSET_MULTIPLE``): the page
      stride exceeds the dense page size.
    * ``layers`` / ``layer``: the caches are layer ``layer`` of a cross-layer pool ``[num_pages, layers, 2, ...]``
      (vLLM's and SGLang's one tensor for every layer; the other layers poison); K and V of a page lie side by
      side as in a combined tensor (``kv`` says whether one ``[num_pages, 2, ...]`` view is handed).
    * ``dim_stride``: elements between consecutive head-dim elements of the caches (the head dim interleaved
      with poison: a last dim of ``dim_stride * D`` read every ``dim_stride``-th element).

    The default (separate NHD caches, contiguous q, offset 0) is no storage at all: ``Case.storage``
    None, left out of the JSON. An MLA case keeps its latent layout (V a view of the one K head):
    only ``q`` and ``pool_offset`` apply to it.
    """

    kv: str = "separate"
    kv_layout: str = "NHD"
    q: str = "contiguous"
    pool_offset: int = 0
    page_padding: int = 0
    layers: int = 1
    layer: int = 0
    dim_stride: int = 1

    def __post_init__(self) -> None:
        for name, allowed in (("kv", KV_STORAGES), ("kv_layout", KV_LAYOUTS), ("q", Q_STORAGES)):
            if getattr(self, name) not in allowed:
                raise CaseError(f"storage.{name} must be one of {allowed}, got {_brief(getattr(self, name))}")
        offset = _int("storage.pool_offset", self.pool_offset, 0, POOL_OFFSET_LIMIT, "the poison around the caches is allocated")
        if offset % POOL_OFFSET_MULTIPLE:
            raise CaseError(f"storage.pool_offset must be a multiple of {POOL_OFFSET_MULTIPLE} (16-byte aligned rows), got {offset}")
        object.__setattr__(self, "pool_offset", offset)
        padding = _int("storage.page_padding", self.page_padding, 0, POOL_OFFSET_LIMIT, "every page's padding is allocated")
        if padding % POOL_OFFSET_MULTIPLE:
            raise CaseError(f"storage.page_padding must be a multiple of {POOL_OFFSET_MULTIPLE} (16-byte aligned rows), got {padding}")
        object.__setattr__(self, "page_padding", padding)
        object.__setattr__(self, "layers", _int("storage.layers", self.layers, 1, LAYERS_LIMIT, "every layer is allocated"))
        object.__setattr__(self, "layer", _int("storage.layer", self.layer, 0, self.layers - 1, "a layer of the pool"))
        object.__setattr__(self, "dim_stride", _int("storage.dim_stride", self.dim_stride, 1, DIM_STRIDE_LIMIT, "the interleave is allocated"))

    @property
    def features(self) -> tuple[str, ...]:
        """The ``ALL_STORAGE_FEATURES`` it uses besides the default (``Capabilities.storages`` names them)."""
        used = (self.kv == "combined", self.kv_layout == "HND", self.q == "fused_qkv", self.pool_offset > 0,
                self.page_padding > 0, self.layers > 1, self.dim_stride > 1)
        return tuple(name for name, on in zip(ALL_STORAGE_FEATURES[1:], used) if on)

    def label(self) -> str:
        values = {"pool_offset": self.pool_offset, "padded_pages": self.page_padding, "cross_layer": f"{self.layer}/{self.layers}",
                  "dim_stride": self.dim_stride}
        return "+".join(f"{name}={values[name]}" if name in values else name for name in self.features)

    def as_json(self) -> dict[str, Any]:
        """Its fields as a case file holds them; the strided fields are left out when off, so the ids of the
        cases written before they existed stay."""
        body = dataclasses.asdict(self)
        for name in ("page_padding", "layers", "layer", "dim_stride"):
            if body[name] == getattr(Storage, name):
                del body[name]
        return body


def storage_features(storage: Storage | None) -> tuple[str, ...]:
    """The storage features of a case: ``("contiguous",)`` for the default storage."""
    return storage.features if storage is not None else ("contiguous",)


@dataclass(frozen=True)
class Case:
    """A complete paged-attention call: layout, heads, options and how to make its tensors.

    Tensors come from ``seed`` and the named data ``distribution`` (``pa_oracle.oracle.tensors``), or from
    an npz sidecar named by ``tensors_file`` (relative to the case file).
    """

    layout: Layout
    heads: Heads
    options: Options = field(default_factory=Options)
    seed: int = 0
    distribution: str = "normal"
    tensors_file: str | None = None
    tensors_sha256: str | None = None  # the sidecar's content (``pa_oracle.oracle.tensors.tensors_digest``)
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    custom_mask: CustomMask | None = None
    storage: Storage | None = None  # how the tensors lie in memory (``Storage``); None: the default
    positions: tuple[tuple[int, ...], ...] | None = None  # per request its queries' RoPE positions; None: index

    def __post_init__(self) -> None:
        self._check_storage()
        self._check_positions()
        if self.custom_mask is not None:
            if not isinstance(self.custom_mask, CustomMask):
                raise CaseError(f"custom_mask: expected a CustomMask, got {type(self.custom_mask).__name__}")
            self.custom_mask.dense(self.layout)  # checks it against the layout
        object.__setattr__(self, "seed", _int("seed", self.seed, 0, SEED_LIMIT - 1, "a 64-bit generator seed"))
        if self.distribution not in DISTRIBUTIONS:
            raise CaseError(f"distribution must be one of {DISTRIBUTIONS}, got {_brief(self.distribution)}")
        if self.tensors_file is not None and not isinstance(self.tensors_file, str):
            raise CaseError(f"tensors_file: expected str or null, got {type(self.tensors_file).__name__}")
        if self.tensors_file is None:
            object.__setattr__(self, "tensors_sha256", None)  # the digest describes a sidecar: none, no digest
        sha = self.tensors_sha256
        if sha is not None and not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
            raise CaseError(f"tensors_sha256: expected 64 lowercase hex digits or null, got {_brief(sha)}")
        if self.options.q_is_fp8 and self.custom_mask is not None:  # an fp8 q on MLA is modelled (module docstring)
            raise CaseError("options.q_dtype: an fp8 q with a custom mask is not modelled")
        rope = self.options.rope
        if rope is not None:
            if self.heads.mla and rope.dims(self.heads.d_kpe) > self.heads.d_kpe:
                raise CaseError(f"options.rope.rotary_dim={rope.rotary_dim} exceeds the MLA rope dims d_kpe={self.heads.d_kpe} "
                                "(only q_pe / kpe rotate)")
            if rope.dims(self.heads.head_dim_qk) > self.heads.head_dim_qk:
                raise CaseError(f"options.rope.rotary_dim={rope.rotary_dim} exceeds head_dim_qk={self.heads.head_dim_qk}")
        for name in ("alibi_slopes", "sinks"):
            values = getattr(self.options, name)
            if values is not None and len(values) != self.heads.num_qo_heads:
                raise CaseError(
                    f"options.{name} has {len(values)} entries, expected num_qo_heads={self.heads.num_qo_heads}"
                )

    def _check_storage(self) -> None:
        storage = self.storage
        if storage is None:
            return
        if not isinstance(storage, Storage):
            raise CaseError(f"storage: expected a Storage, got {type(storage).__name__}")
        if storage == Storage():
            object.__setattr__(self, "storage", None)  # the default storage is no storage: one case, one id
            return
        if self.heads.mla and (storage.kv != "separate" or storage.kv_layout != "NHD"):
            raise CaseError("storage: an MLA case keeps its latent layout (kv 'separate', kv_layout 'NHD'); only q and pool_offset apply")
        if storage.kv == "combined" and self.heads.head_dim_qk != self.heads.head_dim_vo:
            raise CaseError(
                f"storage.kv 'combined' holds K and V in one tensor: needs head_dim_qk == head_dim_vo, got {self.heads.head_dim_qk} and {self.heads.head_dim_vo}"
            )

    def _check_positions(self) -> None:
        """``positions`` as a tuple per request, checked against the layout; the index positions are None."""
        given = self.positions
        if given is None:
            return
        if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
            raise CaseError(f"positions: expected a list (per request) of lists of int, got {type(given).__name__} {_brief(given)}")
        positions = tuple(_ints(f"positions[{b}]", p) for b, p in enumerate(given))
        lay = self.layout
        if len(positions) != lay.batch_size:
            raise CaseError(f"positions has {len(positions)} requests, the layout {lay.batch_size}")
        for b, (p, qo) in enumerate(zip(positions, lay.qo_lens)):
            if len(p) != qo:
                raise CaseError(f"positions[{b}] has {len(p)} entries, request {b} has qo_len {qo}")
        if positions == index_positions(lay):
            object.__setattr__(self, "positions", None)  # the default positions are no positions: one case, one id
            return
        if self.options.rope is None:
            raise CaseError("positions: explicit positions are RoPE positions (they move nothing else); the case has no options.rope")
        object.__setattr__(self, "positions", positions)

    def masks(self) -> list[np.ndarray] | None:
        """Per request the custom ``[qo_len, kv_len]`` mask, or None without one."""
        return None if self.custom_mask is None else self.custom_mask.dense(self.layout)

    @property
    def sm_scale(self) -> float:
        return self.options.sm_scale if self.options.sm_scale is not None else 1.0 / math.sqrt(self.heads.head_dim_qk)

    def replace(self, **changes: Any) -> Case:
        return dataclasses.replace(self, **changes)

    @property
    def case_id(self) -> str:
        """Short stable hash of everything that defines the case. A case with an npz sidecar is
        identified by the sidecar's content (``tensors_sha256``), never by where the file is, so
        the same case in two folders has one id; ``load_case`` fills the digest in. (Only a
        sidecar case built in memory without a digest falls back to its ``tensors_file`` name.)
        Computed once per case object (its fields are frozen; a campaign asks ~10 times a case)."""
        known = self.__dict__.get("_case_id")
        if known is None:
            known = self._hash_id()
            object.__setattr__(self, "_case_id", known)
        return known

    def _hash_id(self) -> str:
        body = _case_body(self)
        body.pop("tensors_sha256", None)
        if self.tensors_file is not None and self.tensors_sha256 is not None:
            body["tensors_file"] = f"sha256:{self.tensors_sha256}"
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]

    def summary(self) -> str:
        lay, h, o = self.layout, self.heads, self.options
        flags = [name for name in ("causal",) if getattr(o, name)]
        if o.window_left >= 0:
            flags.append(f"window_left={o.window_left}")
        if o.logits_soft_cap:
            flags.append(f"soft_cap={o.logits_soft_cap:g}")
        if o.alibi_slopes:
            flags.append("alibi")
        if self.custom_mask is not None:
            flags.append("tree_mask" if self.custom_mask.tree_parents is not None else "custom_mask")
        if h.mla:
            flags.append("mla")
        if o.soft_cap_alibi_order != CAP_THEN_ALIBI:
            flags.append(o.soft_cap_alibi_order)
        if o.sinks:
            flags.append("sinks")
        if o.rope is not None:
            r = o.rope
            partial = "" if r.rotary_dim is None else f" rotary_dim={r.rotary_dim}"
            flags.append(f"rope={r.style} theta={r.theta:g} scale={r.scale:g}{partial}")
        if o.is_fp8:
            flags.append(f"k_scale={o.k_scale:g} v_scale={o.v_scale:g}")
        if o.q_is_fp8:
            flags.append(f"q_scale={o.q_scale:g} o={o.o_dtype}")
        if self.storage is not None:
            flags.append(f"storage={self.storage.label()}")
        if self.positions is not None:
            flags.append(f"positions={[list(p) for p in self.positions]}")
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
        return cls._from_json(data, "case JSON")

    @classmethod
    def _from_json(cls, data: Any, where: str) -> Case:
        """The case in ``data``: types checked strictly (``_CaseFile``), values by the dataclasses;
        every error names ``where`` and the field."""
        if not isinstance(data, dict):
            raise CaseError(f"{where}: a case is a JSON object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION or isinstance(version, bool):
            raise CaseError(f"{where}: unknown case schema_version {_brief(version)}; this version reads {SCHEMA_VERSION}")
        raw: Any = convert(data, _CaseFile, where=where, error=CaseError)  # a _CaseFile (made at import: Any to mypy)
        parts: dict[str, Any] = {}
        for name, kind in (("layout", Layout), ("heads", Heads), ("options", Options)):
            given = _given(getattr(raw, name))
            try:
                if isinstance(given.get("rope"), _RopeFile):
                    try:
                        given["rope"] = Rope(**_given(given["rope"]))
                    except CaseError as exc:
                        raise CaseError(f"rope.{exc}") from None
                parts[name] = kind(**given)
            except CaseError as exc:
                raise CaseError(f"{where}: {name}.{exc}") from None
        try:
            top = {k: v for k, v in _given(raw).items() if k in ("seed", "distribution", "tensors_file", "tensors_sha256", "meta", "positions")}
            if raw.custom_mask is not UNSET and raw.custom_mask is not None:
                top["custom_mask"] = CustomMask(**_given(raw.custom_mask))
            if raw.storage is not UNSET and raw.storage is not None:
                top["storage"] = Storage(**_given(raw.storage))
            case = cls(**parts, **top)
        except CaseError as exc:
            raise CaseError(f"{where}: {exc}") from None
        checkable = case.tensors_file is None or case.tensors_sha256 is not None  # else the id names a path
        if raw.case_id is not msgspec.UNSET and raw.case_id != case.case_id and checkable:
            raise CaseError(f"{where}: case_id {raw.case_id} does not match the case's content ({case.case_id})")
        return case

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load_json(cls, path: str | Path) -> Case:
        """Read a case file's JSON only; ``pa_oracle.oracle.tensors.load_case`` also reads and checks
        its npz sidecar (use that one for a case that will run)."""
        path = Path(path)
        case = cls._from_json(read_json(path, CaseError), str(path))
        if case.tensors_file is not None:
            case = case.replace(tensors_file=str((path.parent / case.tensors_file).resolve()))
        return case


def read_json(path: Path, error: type[Exception]) -> Any:
    """The JSON in ``path``; an unreadable file, bad JSON or a key given twice is ``error(message)``."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: not valid JSON (not UTF-8 text)") from None
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc})") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits (Python's int-parsing limit)
        raise error(f"{path}: not valid JSON ({str(exc)[:200]})") from None
    except _DuplicateKey as exc:
        raise error(f"{path}: not valid JSON (key {exc} given twice)") from None
    except RecursionError:
        raise error(f"{path}: not valid JSON (nested too deeply)") from None


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(repr(key))
        seen.add(key)
    return dict(pairs)


# --- the file schema: types only, made from the dataclasses (no defaults: an absent field takes the dataclass's) ---


def _file_struct(name: str, fields: list[tuple[str, Any] | tuple[str, Any, Any]]) -> type[msgspec.Struct]:
    return msgspec.defstruct(name, fields, forbid_unknown_fields=True)


_Unset = msgspec.UnsetType
UNSET = msgspec.UNSET
_RopeFile = _file_struct("_RopeFile", file_fields(Rope))
_FILE_STRUCTS: dict[type, Any] = {
    Layout: _file_struct("_LayoutFile", file_fields(Layout)),
    Heads: _file_struct("_HeadsFile", file_fields(Heads)),
    Options: _file_struct("_OptionsFile", file_fields(Options, {Rope: _RopeFile})),
    # a mask is given by one of its fields, never null
    CustomMask: _file_struct("_CustomMaskFile", file_fields(CustomMask, not_null=("tree_parents", "bits"))),
    Storage: _file_struct("_StorageFile", file_fields(Storage)),
}


def _case_file() -> type[msgspec.Struct]:
    """``Case``'s fields, the file's ``schema_version`` first and its ``case_id`` (checked against the content) after ``meta``."""
    fields = file_fields(Case, _FILE_STRUCTS)
    at = [f[0] for f in fields].index("meta") + 1
    return _file_struct("_CaseFile", [("schema_version", int), *fields[:at], ("case_id", str | _Unset, UNSET), *fields[at:]])


_CaseFile = _case_file()


def _given(struct: msgspec.Struct | _Unset) -> dict[str, Any]:
    """The fields the file gave (for the dataclass constructor, whose defaults fill the rest)."""
    if struct is UNSET:
        return {}
    return {k: v for k, v in msgspec.structs.asdict(struct).items() if v is not UNSET}


def _case_body(case: Case) -> dict[str, Any]:
    """What the case_id hashes. A family field that is off is left out, so the ids of every case
    written before it existed stay."""
    heads = dataclasses.asdict(case.heads)
    if not case.heads.mla:
        del heads["mla"]
    body = {
        "layout": dataclasses.asdict(case.layout),
        "heads": heads,
        "options": _options_body(case.options),
        "seed": case.seed,
        "distribution": case.distribution,
        "tensors_file": case.tensors_file,
    } | ({"tensors_sha256": case.tensors_sha256} if case.tensors_sha256 is not None else {})
    if case.custom_mask is not None:
        body["custom_mask"] = case.custom_mask.as_json()
    if case.storage is not None:  # the default storage is left out: ids of cases written before it stay
        body["storage"] = case.storage.as_json()
    if case.positions is not None:  # the index positions are left out (None), likewise
        body["positions"] = [list(p) for p in case.positions]
    return body


def _options_body(options: Options) -> dict[str, Any]:
    """The options as written: the default soft-cap/ALiBi order, rope off and the fp8-q fields off are left out, so the
    ids of cases written before those options existed do not change."""
    body = dataclasses.asdict(options)
    if body["soft_cap_alibi_order"] == CAP_THEN_ALIBI:
        del body["soft_cap_alibi_order"]
    if body["rope"] is None:
        del body["rope"]
    if body["q_scale"] == 1.0:  # an fp8 q's fields: left out for every other case
        del body["q_scale"]
    if body["o_dtype"] is None:
        del body["o_dtype"]
    return body


def index_positions(layout: Layout) -> tuple[tuple[int, ...], ...]:
    """Per request its queries' bottom-right positions ``kv_len - qo_len + i`` (the default ``Case.positions``)."""
    return tuple(tuple(range(kv - qo, kv)) for qo, kv in zip(layout.qo_lens, layout.kv_lens))


def tree_depths(parents: Iterable[int]) -> tuple[int, ...]:
    """Each node's depth in a draft tree (``CustomMask.tree_parents`` of one request): 0 for a root."""
    depths: list[int] = []
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    return tuple(depths)


def tree_positions(layout: Layout, tree_parents: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """EAGLE's positions of a tree case: node ``n`` of a request with prefix ``P = kv_len - qo_len`` at
    ``P + depth(n)`` (SGLang's and vLLM's draft-tree verify)."""
    return tuple(tuple(kv - qo + d for d in tree_depths(parents))
                 for parents, qo, kv in zip(tree_parents, layout.qo_lens, layout.kv_lens))


def alibi_slopes(num_heads: int) -> tuple[float, ...]:
    """The ALiBi paper's geometric slopes (closest power of two, then interleaved)."""
    n = 1 << int(math.floor(math.log2(num_heads)))
    base = [2 ** (-8 * (i + 1) / n) for i in range(n)]
    extra = [2 ** (-4 * (2 * i + 1) / n) for i in range(num_heads - n)]
    return tuple(base + extra)
