"""SGLang's Triton extend (prefill with a cached prefix) kernel, ``extend_attention_fwd``
(``sglang.srt.layers.attention.triton_ops.extend_attention``).

Mapping: the last ``qo_len`` keys of each request are the "extend" tokens, handed over as
contiguous ``k_extend``/``v_extend`` rows next to the queries (``qo_indptr``); the first
``kv_len - qo_len`` are the prefix, read from the pool through token-level ``kv_indptr`` /
``kv_indices`` (``page * page_size + slot`` into ``k_cache.view(-1, Hkv, D)``, a view: the kernel
sees the canonical bytes, poison included). ``is_causal`` masks only the extend part (every prefix
key precedes every query), as the oracle's bottom-right causal does when ``qo_len <= kv_len``.

Conventions (read from the kernel): the window mask is ``q_pos <= k_pos + sliding_window_size``,
enabled only when ``sliding_window_size > 0``: FlashInfer's ``window_left`` for ``w >= 1``, and
``window_left = 0`` cannot be expressed. ``logit_cap`` caps the scaled logit; a sink adds
``exp(sink - max)`` to the denominator. Every argument is passed by keyword (0.5.x moved
``k_scale``/``v_scale`` in between positional ones); fp8 KV is declared only when the installed
kernel takes ``k_scale``/``v_scale``, which scale the prefix (pool) part: the extend rows are
given dequantized, as SGLang gives the model-dtype K/V it has just written to the pool.
``tl.dot`` needs every block dim >= 16, so head dims start at 16. No ALiBi, no LSE.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from pa_oracle.backends.base import Backend, Capabilities, CompileKey, KernelOutput, register
from pa_oracle.oracle.case import FP8_DTYPES, Case, Layout
from pa_oracle.oracle.tensors import Tensors, token_addresses

_MODULE = "sglang.srt.layers.attention.triton_ops.extend_attention"
_PASSED = frozenset({"q_extend", "k_extend", "v_extend", "o_extend", "k_buffer", "v_buffer", "qo_indptr", "kv_indptr",
                     "kv_indices", "custom_mask", "is_causal", "mask_indptr", "max_len_extend", "sm_scale", "logit_cap",
                     "sliding_window_size", "sinks"})
_SCALES = frozenset({"k_scale", "v_scale"})
_NO_WINDOW_0 = "window_left=0 (SGLang's sliding_window_size enables a window only when > 0)"

_SGLANG_EXTEND = Capabilities(
    devices=("cuda",), q_dtypes=("float16", "bfloat16"),
    head_dims=(16, 24, 32, 40, 48, 64, 80, 96, 112, 128, 192, 256),
    qo_len_above_kv_len=False, alibi=False, fp8_scales=False, returns_lse=False,
    storages=("contiguous", "fused_qkv", "pool_offset"),  # a flat token buffer, as the decode adapter's
)


def capabilities_for(parameters: Collection[str]) -> Capabilities:
    """The adapter's capabilities for an ``extend_attention_fwd`` with these parameter names."""
    if _SCALES <= set(parameters):
        return _SGLANG_EXTEND.replace(kv_dtypes=FP8_DTYPES, fp8_scales=True)
    return _SGLANG_EXTEND


@functools.cache
def _kernel() -> tuple[Any, frozenset[str]]:
    """(extend_attention_fwd, its parameter names); raises whatever SGLang's import raises."""
    import importlib

    fn = importlib.import_module(_MODULE).extend_attention_fwd
    return fn, frozenset(inspect.signature(fn).parameters)


def signature_mismatch(fn: Any) -> str | None:
    """Why this adapter's keyword call does not fit ``fn``'s signature, or None."""
    params = inspect.signature(fn).parameters
    passed = _PASSED | (_SCALES & set(params))
    missing = sorted(_PASSED - set(params))
    required = sorted(name for name, p in params.items() if p.default is inspect.Parameter.empty and name not in passed)
    if missing:
        return f"this sglang's extend_attention_fwd takes no {missing} (the kv_indptr/kv_indices API of sglang >= 0.5)"
    if required:
        return f"this sglang's extend_attention_fwd requires {required}, which this adapter does not pass"
    return None


@dataclass(frozen=True)
class ExtendIndices:
    """Token-level indices of a case split into SGLang's prefix and extend parts."""

    kv_indptr: tuple[int, ...]  # prefix lengths, CSR
    kv_indices: tuple[int, ...]  # prefix tokens' flat pool slots
    extend_slots: tuple[int, ...]  # extend tokens' flat pool slots, in qo_indptr order


def extend_indices(case: Case) -> ExtendIndices:
    """The prefix is each request's first ``kv_len - qo_len`` keys, the extend part its last ``qo_len``."""
    lay: Layout = case.layout
    pages, slots = token_addresses(case)
    flat = (pages * lay.page_size + slots).tolist()
    kv_indptr, kv_indices, extend_slots, start = [0], [], [], 0
    for b, (qo_len, kv_len) in enumerate(zip(lay.qo_lens, lay.kv_lens)):
        if qo_len > kv_len:
            raise ValueError(f"request {b}: qo_len={qo_len} > kv_len={kv_len} has no extend/prefix split")
        prefix = kv_len - qo_len
        kv_indices += flat[start : start + prefix]
        extend_slots += flat[start + prefix : start + kv_len]
        kv_indptr.append(kv_indptr[-1] + prefix)
        start += kv_len
    return ExtendIndices(tuple(kv_indptr), tuple(kv_indices), tuple(extend_slots))


@register
class SglangExtend(Backend):
    name = "sglang-extend"
    description = "SGLang Triton extend_attention_fwd: paged prefix via kv_indices + contiguous extend K/V"
    capabilities = _SGLANG_EXTEND
    family = "sglang-triton-extend"
    # Triton compiles ``_fwd_kernel`` per dtype and per constexpr (0.5.10.post1: Lq, Lv, IS_CAUSAL, HAS_SINK and the
    # values of SLIDING_WINDOW_SIZE and logit_cap); the int arguments' ==1 / %16 specializations (kv_group_num,
    # strides) add a few more per key (the heads are left out of the key: with them it would have ~2M keys), which the
    # campaign counts as compiling when it sees them. On the H200 a key took ~15 s with those (session 10).
    compile_fields: ClassVar[tuple[str, ...]] = (
        "q_dtype", "kv_dtype", "head_dim_qk", "head_dim_vo", "causal", "window_left", "logits_soft_cap", "sinks")
    compile_seconds = 15.0

    def __init__(self) -> None:
        try:
            self.capabilities = capabilities_for(_kernel()[1])
        except Exception:  # noqa: BLE001 - unavailable_reason says why
            pass

    def unavailable_reason(self) -> str | None:
        try:
            fn, _ = _kernel()
        except Exception as exc:  # noqa: BLE001 - sglang's import pulls many modules
            return f"sglang's Triton extend kernel does not import ({type(exc).__name__}: {str(exc)[:80]})"
        return signature_mismatch(fn) or super().unavailable_reason()

    def versions(self) -> dict[str, str]:
        import sglang
        import triton  # type: ignore[import-untyped]  # triton ships no type information (no py.typed, no stubs)

        return {**super().versions(), "sglang": getattr(sglang, "__version__", "?"), "triton": triton.__version__}

    def unsupported_reason(self, case: Case) -> str | None:
        reason = super().unsupported_reason(case)
        if reason is None and case.options.window_left == 0:
            return f"unsupported: {_NO_WINDOW_0}"
        return reason

    def built_reason(self, key: CompileKey) -> str | None:
        if dict(key).get("window_left") == 0:
            return f"refused: {_NO_WINDOW_0}"
        return None  # Triton's own cache is not read: a key's first case is counted as compiling

    def plan(self, case: Case) -> dict[str, Any]:
        device = self.device or "cuda"
        idx = extend_indices(case)
        as_tensor = lambda xs, dtype: torch.tensor(xs, dtype=dtype, device=device)  # noqa: E731
        return {
            "case": case,
            "qo_indptr": as_tensor(case.layout.qo_indptr, torch.int32),
            "kv_indptr": as_tensor(idx.kv_indptr, torch.int32),
            "kv_indices": as_tensor(idx.kv_indices, torch.int64),
            "extend_slots": as_tensor(idx.extend_slots, torch.int64),
        }

    def call_source(self, case: Case) -> str | None:
        idx = extend_indices(case)
        return f"""\
import inspect

from sglang.srt.layers.attention.triton_ops.extend_attention import extend_attention_fwd

# each request's first kv_len - qo_len keys are the prefix (read from the pool), its last qo_len the extend part
prefix_indptr = {list(idx.kv_indptr)}
prefix_slots = {list(idx.kv_indices)}
extend_slots = {list(idx.extend_slots)}
k_buffer, v_buffer = k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:])
slots = torch.tensor(extend_slots, dtype=torch.int64, device=device)
k_extend, v_extend = k_buffer[slots], v_buffer[slots]
if k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # the extend rows in the model dtype, as SGLang has them
    k_extend = (k_extend.float() * k_scale).to(q.dtype)
    v_extend = (v_extend.float() * v_scale).to(q.dtype)
out = torch.full((q.shape[0], num_qo_heads, head_dim_vo), math.nan, dtype=q.dtype, device=device)
kwargs = dict(
    q_extend=q, k_extend=k_extend, v_extend=v_extend, o_extend=out, k_buffer=k_buffer, v_buffer=v_buffer,
    qo_indptr=index(qo_indptr), kv_indptr=index(prefix_indptr),
    kv_indices=torch.tensor(prefix_slots, dtype=torch.int64, device=device), custom_mask=None, is_causal=causal,
    mask_indptr=None, max_len_extend=max(qo_lens), sm_scale=sm_scale, logit_cap=logits_soft_cap,
    sliding_window_size=window_left,
    sinks=None if sinks is None else torch.tensor(sinks, dtype=torch.float32, device=device),
)
if {{"k_scale", "v_scale"}} <= set(inspect.signature(extend_attention_fwd).parameters):
    kwargs.update(k_scale=k_scale, v_scale=v_scale)
extend_attention_fwd(**kwargs)
lse = None  # this kernel returns no LSE
"""

    def extra_arguments(self, plan: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments that replace the plain call's (a mask adapter's ``custom_mask``)."""
        return {}

    def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
        fn, params = _kernel()
        case: Case = plan["case"]
        heads, opts = case.heads, case.options
        k_buffer = tensors.k_cache.view(-1, *tensors.k_cache.shape[2:])
        v_buffer = tensors.v_cache.view(-1, *tensors.v_cache.shape[2:])
        k_extend, v_extend = k_buffer[plan["extend_slots"]], v_buffer[plan["extend_slots"]]
        if opts.is_fp8:
            k_extend = (k_extend.float() * opts.k_scale).to(tensors.q.dtype)
            v_extend = (v_extend.float() * opts.v_scale).to(tensors.q.dtype)
        out = torch.full((tensors.q.shape[0], heads.num_qo_heads, heads.head_dim_vo), math.nan, dtype=tensors.q.dtype, device=tensors.q.device)
        sinks = None if opts.sinks is None else torch.tensor(opts.sinks, dtype=torch.float32, device=out.device)
        kwargs: dict[str, Any] = {
            "q_extend": tensors.q, "k_extend": k_extend, "v_extend": v_extend, "o_extend": out,
            "k_buffer": k_buffer, "v_buffer": v_buffer, "qo_indptr": plan["qo_indptr"], "kv_indptr": plan["kv_indptr"],
            "kv_indices": plan["kv_indices"], "custom_mask": None, "is_causal": opts.causal, "mask_indptr": None,
            "max_len_extend": max(case.layout.qo_lens), "sm_scale": case.sm_scale, "logit_cap": opts.logits_soft_cap,
            "sliding_window_size": opts.window_left, "sinks": sinks,
        }
        if _SCALES <= params:  # triton_backend passes layer.k_scale_float (1.0 when unset)
            kwargs.update(k_scale=opts.k_scale, v_scale=opts.v_scale)
        kwargs.update(self.extra_arguments(plan))
        fn(**kwargs)
        return KernelOutput(out, None)
