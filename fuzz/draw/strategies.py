"""Hypothesis strategies for paged-attention cases, biased to where kernels break.

Verification model: every drawn case is valid (``pa_oracle.oracle.case`` validates it) and admitted by the
kernel's ``Capabilities`` (filtered *before* drawing, no mass rejection). Draws are ordered so
that shrinking heads for small batches, short sequences, identity page tables, small heads and
options off.

Edges drawn on purpose: kv_len in {0, 1, page-1, page, page+1, 2 pages, many pages}; qo_len 1
(decode), 2-8 (speculative), chunked prefill, full prefill, qo_len > kv_len; mixed batches;
random page permutations with unused pool pages; page sizes 1..256; GQA groups 1..32 including
5, 6, 7; every option; five data distributions; the memory layouts the kernel declares (``storages``).

Variant-aware drawing: ``cases(..., variants=KEYS)`` draws a compile key from ``KEYS`` first (each a
``pa_oracle.backends.base.CompileKey``: field values that select a compiled kernel variant), then
draws everything else as always, with those fields pinned to the key's values, so every case runs on
an already-built variant (constructed, not rejected). ``variants=None`` draws exactly as before.

EXTENDING: a new knob is one labelled ``draw`` here plus a ``Capabilities`` field that gates it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from pa_oracle.backends.base import VARIANT_FIELDS, Capabilities, CompileKey
from pa_oracle.fuzz.draw import built, families, storages
from pa_oracle.oracle.case import CAP_THEN_ALIBI, DISTRIBUTIONS, FP8_DTYPES, Case, Heads, Layout, Options, Rope, alibi_slopes

PAGE_SIZES = (16, 1, 2, 3, 5, 8, 32, 64, 128, 256)  # shrinks toward the first
GROUP_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32)
HEAD_DIMS = (16, 8, 32, 64, 24, 40, 80, 128)
SOFT_CAPS = (30.0, 1.0, 5.0, 50.0)
# the windows a compile key may name (a kernel compiling per window value): small ones cut often
WINDOW_VALUES = (0, 1, 2, 3, 5, 8, 17, 32, 63, 128, 255)
SM_SCALES = (0.5, 0.05, 1.0, 0.3)
FP8_SCALES = (1.0, 0.75, 0.5, 0.25, 2.0)
QO_MODES = ("decode", "speculative", "chunked_prefill", "full_prefill", "qo_above_kv", "no_queries")
ROPE_THETAS = (1e4, 5e5, 1e6, 100.0)  # Llama 2, Llama 3, Qwen 2; a small base turns every pair fast
ROPE_SCALES = (1.0, 8.0, 2.0, 0.5)


@dataclass(frozen=True)
class Limits:
    """Size bounds of drawn cases (cost, not capability)."""

    max_batch: int = 6
    max_kv_len: int = 300
    max_qo_len: int = 64
    max_extra_pages: int = 4
    max_kv_heads: int = 4
    max_qo_heads: int = 32
    head_dims: tuple[int, ...] = HEAD_DIMS


def _page_sizes(caps: Capabilities) -> list[int]:
    allowed = caps.page_sizes or PAGE_SIZES
    if caps.page_size_multiple > 1 and caps.page_sizes is None:
        allowed = tuple(caps.page_size_multiple * k for k in (1, 2))
    sizes = [p for p in allowed if p % caps.page_size_multiple == 0]
    if not sizes:
        raise ValueError(f"no page size satisfies {caps}")
    return sizes


def _kv_len(draw: st.DrawFn, page: int, limits: Limits, min_len: int, label: str) -> int:
    edges = sorted({n for n in (1, page - 1, page, page + 1, 2 * page, 0) if min_len <= n <= limits.max_kv_len})
    return draw(built.one_of(built.integers(min_len, limits.max_kv_len), built.sampled_from(edges)), label=label)


def _qo_len(draw: st.DrawFn, kv_len: int, caps: Capabilities, limits: Limits, min_len: int, label: str) -> int:
    cap = min(limits.max_qo_len, caps.max_qo_len or limits.max_qo_len)
    modes = [m for m in QO_MODES if not (m == "no_queries" and min_len > 0)]
    if not caps.qo_len_above_kv_len:
        modes.remove("qo_above_kv")
    mode = draw(built.sampled_from(modes), label=label + " mode")
    if mode == "decode":
        n = 1
    elif mode == "speculative":
        n = draw(built.integers(2, 8), label=label)
    elif mode == "chunked_prefill":
        n = draw(built.integers(1, max(kv_len, 1)), label=label)
    elif mode == "full_prefill":
        n = kv_len
    elif mode == "qo_above_kv":
        n = kv_len + draw(built.integers(1, 8), label=label)
    else:
        n = 0
    if not caps.qo_len_above_kv_len:
        n = min(n, kv_len)
    return max(min_len, caps.min_qo_len, min(n, cap))


@st.composite
def layouts(draw: st.DrawFn, caps: Capabilities = Capabilities(), limits: Limits = Limits()) -> Layout:
    """Ragged batches with random page tables (see the module docstring)."""
    page = draw(built.sampled_from(_page_sizes(caps)), label="page_size")
    smallest = 2 if caps.mixed_batch else 1  # a decode and a prefill request
    if caps.mixed_batch and (caps.uniform_qo_len or min(limits.max_qo_len, caps.max_qo_len or 2) < 2):
        raise ValueError("mixed_batch needs requests of two qo_lens: not with uniform_qo_len or a max_qo_len below 2")
    batch = draw(built.integers(smallest, max(limits.max_batch, smallest)), label="batch_size")
    min_len = 0 if caps.empty_requests else 1
    kv_lens = [_kv_len(draw, page, limits, min_len, f"kv_len[{b}]") for b in range(batch)]
    qo_lens = [_qo_len(draw, kv_lens[b], caps, limits, min_len, f"qo_len[{b}]") for b in range(batch)]
    if caps.min_qo_len > 0 and not caps.qo_len_above_kv_len:
        kv_lens = [max(k, q) for k, q in zip(kv_lens, qo_lens)]
    if caps.uniform_qo_len:
        qo_lens = [max(qo_lens[0], 1)] * batch
    if caps.mixed_batch:
        _mix(draw, qo_lens, kv_lens, caps)
    if sum(qo_lens) == 0:
        qo_lens[0] = 1  # a call with no query at all tests nothing
        if not caps.qo_len_above_kv_len:
            kv_lens[0] = max(kv_lens[0], 1)
    needed = sum(-(-n // page) for n in kv_lens)
    extra = draw(built.integers(0, limits.max_extra_pages), label="unused_pool_pages")
    order = draw(built.permutations(range(needed + extra)), label="page_order")
    return Layout.from_lengths(qo_lens, kv_lens, page, page_order=order, extra_pages=extra)


def _mix(draw: st.DrawFn, qo_lens: list[int], kv_lens: list[int], caps: Capabilities) -> None:
    """Make the batch hold a decode request (qo_len 1) and a longer one, if it does not: two drawn requests
    become one of each (the one made longer gets at least 2 queries)."""
    if 1 in qo_lens and any(n > 1 for n in qo_lens):
        return
    decode = draw(built.integers(0, len(qo_lens) - 1), label="decode request")
    other = (decode + 1 + draw(built.integers(0, len(qo_lens) - 2), label="prefill request")) % len(qo_lens)
    qo_lens[decode] = 1
    qo_lens[other] = max(qo_lens[other], 2)
    if not caps.qo_len_above_kv_len:
        kv_lens[decode], kv_lens[other] = max(kv_lens[decode], 1), max(kv_lens[other], qo_lens[other])


@st.composite
def heads(
    draw: st.DrawFn, caps: Capabilities = Capabilities(), limits: Limits = Limits(), pinned: Mapping[str, Any] = {}
) -> Heads:
    num_kv = _pick(draw, pinned, "num_kv_heads", lambda: built.integers(1, limits.max_kv_heads))
    group = _pick(draw, pinned, "group_size", lambda: built.sampled_from(_groups(caps, limits, num_kv)))
    dims = _head_dims(caps, limits)
    dim_qk = _pick(draw, pinned, "head_dim_qk", lambda: built.sampled_from(dims))
    dim_vo = dim_qk
    if "head_dim_vo" in pinned:
        dim_vo = pinned["head_dim_vo"]
    elif caps.head_dim_vo_may_differ and draw(built.booleans(), label="head_dim_vo differs"):
        dim_vo = draw(built.sampled_from(dims), label="head_dim_vo")
    return Heads(num_kv * group, num_kv, dim_qk, dim_vo)


def _pick(draw: st.DrawFn, pinned: Mapping[str, Any], field: str, strategy: Any) -> Any:
    """``pinned[field]`` if the compile key fixes it, else a draw of ``strategy()`` labelled ``field``."""
    return pinned[field] if field in pinned else draw(strategy(), label=field)


def _switch(draw: st.DrawFn, pinned: Mapping[str, Any], field: str, reachable: bool, label: str) -> bool:
    """An option switch: the key's value if pinned, else a coin (when ``caps`` lets it be on)."""
    return bool(pinned[field]) if field in pinned else reachable and draw(built.booleans(), label=label)


def _groups(caps: Capabilities, limits: Limits, num_kv: int) -> list[int]:
    return [g for g in GROUP_SIZES if g * num_kv <= limits.max_qo_heads and g <= (caps.max_group_size or g)]


def _head_dims(caps: Capabilities, limits: Limits) -> list[int]:
    return [d for d in limits.head_dims if caps.head_dims is None or d in caps.head_dims] or list(caps.head_dims or ())


def _key_dims(caps: Capabilities, limits: Limits, vo: bool) -> list[int]:
    """The head dims (``vo``: V's) a compile key may name: the drawn ones, and those of the MLA pairs
    where ``caps`` draws MLA (an MLA-only kernel: those alone)."""
    dims = [] if caps.mla == (True,) else _head_dims(caps, limits)
    if True in caps.mla:
        dims += [pair[vo] for pair in families.mla_dims(caps) if pair[vo] not in dims]
    return dims


@st.composite
def options(
    draw: st.DrawFn, num_qo_heads: int, max_kv_len: int, caps: Capabilities = Capabilities(), pinned: Mapping[str, Any] = {},
    head_dim_qk: int = 0,
) -> Options:
    q_dtype = _pick(draw, pinned, "q_dtype", lambda: built.sampled_from(caps.q_dtypes))
    kv_dtype = _pick(draw, pinned, "kv_dtype", lambda: built.sampled_from(caps.accepted_kv_dtypes(q_dtype)))
    k_scale = v_scale = 1.0
    if kv_dtype in FP8_DTYPES and caps.fp8_scales:
        k_scale = draw(built.sampled_from(FP8_SCALES), label="k_scale")
        v_scale = draw(built.sampled_from(FP8_SCALES), label="v_scale")
    q_scale, o_dtype = 1.0, None  # an fp8 q's (drawn only for it: every other kernel draws as before)
    if q_dtype in FP8_DTYPES:
        q_scale = draw(built.sampled_from(FP8_SCALES), label="q_scale") if caps.fp8_scales else 1.0
        o_dtype = _pick(draw, pinned, "o_dtype", lambda: built.sampled_from(caps.o_dtypes))
    causal = _pick(draw, pinned, "causal", lambda: built.sampled_from(sorted(caps.causal)))
    window_left = -1
    if "window_left" in pinned:  # a kernel that compiles per window value (a Triton constexpr)
        window_left = pinned["window_left"]
    elif _switch(draw, pinned, "window", caps.window_left, "sliding window"):
        window_left = draw(built.integers(0, max(max_kv_len, 1)), label="window_left")
    soft_cap = 0.0
    if "logits_soft_cap" in pinned:  # likewise per cap value
        soft_cap = pinned["logits_soft_cap"]
    elif _switch(draw, pinned, "soft_cap", caps.logits_soft_cap, "soft cap"):
        soft_cap = draw(built.sampled_from(SOFT_CAPS), label="logits_soft_cap")
    slopes = alibi_slopes(num_qo_heads) if _switch(draw, pinned, "alibi", caps.alibi, "alibi") else None
    sinks = None
    if _switch(draw, pinned, "sinks", caps.sinks, "sinks"):
        sinks = tuple(draw(built.lists(built.sampled_from((0.0, 1.0, -2.0, 4.0)), min_size=num_qo_heads, max_size=num_qo_heads), label="sinks"))
    sm_scale = None
    if caps.custom_sm_scale and draw(built.booleans(), label="custom sm_scale"):
        sm_scale = draw(built.sampled_from(SM_SCALES), label="sm_scale")
    rope = None  # drawn last and only for a kernel that declares it: every other kernel draws as before
    if True in caps.rope and q_dtype not in FP8_DTYPES:  # RoPE of an fp8 q is not modelled (the case refuses it)
        optional = False in caps.rope
        if _switch(draw, pinned, "rope", True, "rope") if optional else pinned.get("rope", True):
            rope = _rope(draw, caps, head_dim_qk)
    return Options(
        causal=causal, sm_scale=sm_scale, window_left=window_left, logits_soft_cap=soft_cap,
        alibi_slopes=slopes, sinks=sinks, q_dtype=q_dtype, kv_dtype=kv_dtype, k_scale=k_scale, v_scale=v_scale,
        q_scale=q_scale, o_dtype=o_dtype,
        # not drawn: the kernel's own order where it matters (the case stays the same elsewhere)
        soft_cap_alibi_order=caps.soft_cap_alibi_order if soft_cap and slopes else CAP_THEN_ALIBI, rope=rope,
    )


def _rope(draw: st.DrawFn, caps: Capabilities, head_dim_qk: int) -> Rope:
    style = draw(built.sampled_from(caps.rope_styles), label="rope style")
    theta = draw(built.sampled_from(ROPE_THETAS), label="rope theta")
    scale = draw(built.sampled_from(ROPE_SCALES), label="rope scale")
    rotary_dim = None
    partial = [d for d in range(2, head_dim_qk, 2) if d in (head_dim_qk // 2, head_dim_qk // 4, 2) or d == head_dim_qk - 2]
    if caps.rope_partial and partial and draw(built.booleans(), label="partial rotary"):
        rotary_dim = draw(built.sampled_from(sorted(set(partial), reverse=True)), label="rotary_dim")
    return Rope(style=style, theta=theta, scale=scale, rotary_dim=rotary_dim)


@st.composite
def cases(
    draw: st.DrawFn,
    caps: Capabilities = Capabilities(),
    limits: Limits = Limits(),
    variants: Sequence[CompileKey] | None = None,
    redirect: Callable[[CompileKey], CompileKey] | None = None,
) -> Case:
    """A complete case that a kernel with ``caps`` accepts; with ``variants`` (compile keys from
    ``variant_keys``), one inside a key drawn from them, passed through ``redirect`` (at draw time:
    a campaign steers a key it may no longer compile to a built one).

    >>> from hypothesis import find
    >>> find(cases(), lambda c: c.options.causal and c.heads.group_size == 7).heads.group_size
    7
    """
    pinned: dict[str, Any] = {}
    if variants is not None:
        if not variants:
            raise ValueError("variants: no compile key to draw from")
        key = draw(built.sampled_from(list(variants)), label="compile key")
        pinned = dict(redirect(key) if redirect else key)
        if "group_size" in pinned and pinned.get("mla", caps.mla == (True,)) is True:
            pinned.setdefault("num_kv_heads", 1)  # an MLA case has one latent head: its group is all its qo heads
    layout = draw(layouts(caps, limits), label="layout")
    head = draw(heads(caps, limits, pinned), label="heads")
    opts = draw(options(head.num_qo_heads, max(layout.kv_lens), caps, pinned, head.head_dim_qk), label="options")
    distribution = draw(built.sampled_from(DISTRIBUTIONS), label="distribution")
    seed = draw(built.integers(0, 2**31 - 1), label="seed")
    case = Case(layout, head, opts, seed=seed, distribution=distribution)
    if caps.custom_mask != (False,) or caps.mla != (False,):  # off by default: existing kernels draw as before
        case = draw(families.extend(case, caps, max_prefix=limits.max_kv_len, pinned=pinned), label="families")
    if storages.wants_storage(caps):  # off by default: a kernel declaring only "contiguous" draws as before
        case = draw(storages.storage(case, caps), label="storage")
    return case


def field_values(caps: Capabilities, limits: Limits, field: str) -> list[Any]:
    """Every value of a ``VARIANT_FIELDS`` field that these strategies draw for ``caps`` (pairs that
    cannot go together are removed by ``variant_keys``)."""
    values: dict[str, list[Any]] = {
        "q_dtype": list(caps.q_dtypes),
        "kv_dtype": list(dict.fromkeys(kv for q in caps.q_dtypes for kv in caps.accepted_kv_dtypes(q))),
        "o_dtype": list(dict.fromkeys(o for q in caps.q_dtypes for o in _out_dtypes(caps, q))),
        "head_dim_qk": _key_dims(caps, limits, vo=False),
        "head_dim_vo": _key_dims(caps, limits, vo=True),
        "num_kv_heads": list(range(1, limits.max_kv_heads + 1)),
        "group_size": [g for g in GROUP_SIZES if g <= limits.max_qo_heads and g <= (caps.max_group_size or g)],
        "causal": sorted(caps.causal),
        "alibi": [False, True] if caps.alibi else [False],
        "window": [False, True] if caps.window_left else [False],
        "soft_cap": [False, True] if caps.logits_soft_cap else [False],
        "window_left": [-1, *WINDOW_VALUES] if caps.window_left else [-1],
        "logits_soft_cap": [0.0, *SOFT_CAPS] if caps.logits_soft_cap else [0.0],
        "sinks": [False, True] if caps.sinks else [False],
        "rope": sorted(caps.rope),
        "mla": sorted(caps.mla),
    }
    if field not in VARIANT_FIELDS or field not in values:
        raise ValueError(f"unknown compile-key field {field!r}; known: {sorted(values)}")
    return values[field]


def _out_dtypes(caps: Capabilities, q_dtype: str) -> tuple[str, ...]:
    """The output dtypes of a q dtype: its own, or ``caps.o_dtypes`` for an fp8 q."""
    return caps.o_dtypes if q_dtype in FP8_DTYPES else (q_dtype,)


def _drawable(caps: Capabilities, limits: Limits, v: Mapping[str, Any]) -> bool:
    """Whether ``cases`` can draw these pinned values together."""
    if "q_dtype" in v and "kv_dtype" in v and v["kv_dtype"] not in caps.accepted_kv_dtypes(v["q_dtype"]):
        return False
    if "q_dtype" not in v and "kv_dtype" in v and not all(v["kv_dtype"] in caps.accepted_kv_dtypes(q) for q in caps.q_dtypes):
        return False  # q is drawn freely: the KV dtype must go with every q dtype
    if "o_dtype" in v and not all(v["o_dtype"] in _out_dtypes(caps, q) for q in ([v["q_dtype"]] if "q_dtype" in v else caps.q_dtypes)):
        return False
    mla = v["mla"] if "mla" in v else True if caps.mla == (True,) else None  # an MLA-only kernel's keys are MLA keys
    if mla is True and not _mla_drawable(caps, v):
        return False
    if mla is False and not all(v[f] in _head_dims(caps, limits) for f in ("head_dim_qk", "head_dim_vo") if f in v):
        return False
    if (mla is not True and "head_dim_vo" in v and not caps.head_dim_vo_may_differ
            and v["head_dim_vo"] != v.get("head_dim_qk", v["head_dim_vo"])):
        return False
    if "group_size" in v and v["group_size"] * v.get("num_kv_heads", 1) > limits.max_qo_heads:
        return False
    return True


def _mla_drawable(caps: Capabilities, v: Mapping[str, Any]) -> bool:
    """Whether an MLA case has these pinned values: one latent KV head, dims of an MLA pair."""
    pairs = families.mla_dims(caps)
    return v.get("num_kv_heads", 1) == 1 and any(
        v.get("head_dim_qk", qk) == qk and v.get("head_dim_vo", vo) == vo for qk, vo in pairs
    )


def variant_keys(caps: Capabilities, limits: Limits, fields: Sequence[str]) -> list[CompileKey]:
    """Every compile key over ``fields`` that ``cases`` can draw for ``caps`` within ``limits``
    (``[()]`` for no fields: one variant, nothing compiles per case)."""
    domains = [field_values(caps, limits, f) for f in fields]
    keys = [tuple(zip(fields, combo)) for combo in itertools.product(*domains)]
    return [key for key in keys if _drawable(caps, limits, dict(key))]
