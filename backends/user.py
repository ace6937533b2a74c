"""Fuzz a user's own attention function without writing an adapter.

The function takes the canonical layout directly::

    def my_attention(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                     causal, sm_scale, window_left, logits_soft_cap) -> out | (out, lse)

``q`` [total_q, Hq, Dqk], caches [num_pages, page_size, Hkv, D] (NHD), int32 index tensors on the
same device, ``out`` [total_q, Hq, Dvo] in q's dtype, ``lse`` natural log [total_q, Hq]. Optional
keywords ``alibi_slopes`` / ``sinks`` (float32 [Hq]) and ``k_scale`` / ``v_scale`` (floats; fp8 KV)
are passed when the signature has them. An option the function does not accept is held at its
neutral value for it (never drawn). A function that names ``custom_mask`` (and ``mask_indptr``)
is also given custom-mask cases: FlashInfer's packed form, each request's ``[qo_len, kv_len]``
mask flattened row-major and packed little-endian (uint8), ``mask_indptr`` (int32 [B + 1]) its
byte offsets; None for a case without a mask. ``@declare(mla=(True,))`` asks for MLA cases:
one latent KV head, ``v_cache`` the view ``k_cache[..., :d_ckv]``, q's first ``d_ckv`` dims
``q_nope``, the rest ``q_pe``. A function that names ``rope`` is also given RoPE cases: ``rope`` is
the case's ``pa_oracle.oracle.case.Rope`` (style, theta, scale, rotary_dim) or None, and the function
rotates q and k itself by absolute position (``pa_oracle.oracle.rope``). ``@declare(...)`` narrows further, with ``Capabilities`` fields::

    @declare(q_dtypes=("bfloat16",), page_sizes=(16, 32), devices=("cuda",))
    def my_attention(...): ...

Memory layouts: ``@declare(storages=STORAGE_FEATURES)`` (``oracle.case``; or some of them) asks for
cases whose tensors lie in another ``Storage``: q may then be a strided view into a fused QKV buffer
and the caches strided views (the halves of one ``[pages, 2, ...]`` tensor, HND memory, an offset into a
larger pool), still indexed ``[num_pages, page_size, Hkv, D]``: a kernel that indexes through the
strides reads them right, one that assumes contiguous memory does not. A function that names
``kv_layout`` gets the caches in the stored page layout instead (``[num_pages, Hkv, page_size, D]`` when
it is ``"HND"``) and the layout's name; one that names ``paged_kv_cache`` also gets the single
``[num_pages, 2, ...]`` tensor of a combined storage in that layout (None otherwise).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from dataclasses import dataclass, fields
from typing import Any, Callable

import torch
from pa_oracle.backends.base import Backend, Capabilities, ContractViolation, KernelOutput
from pa_oracle.oracle.case import FP8_DTYPES, Case, flashinfer_packed_mask
from pa_oracle.oracle.tensors import Tensors

ATTRIBUTE = "pa_oracle_capabilities"
_CAPABILITY_FIELDS = {f.name for f in fields(Capabilities)}
_OPTION_FLAGS = {  # keyword -> Capabilities field it enables
    "window_left": "window_left",
    "logits_soft_cap": "logits_soft_cap",
    "alibi_slopes": "alibi",
    "sinks": "sinks",
    "sm_scale": "custom_sm_scale",
}
_LAYOUT_KWARGS = ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len")


def declare(**capabilities: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Narrow what the fuzzer draws for a user kernel (``Capabilities`` field names)."""
    unknown = set(capabilities) - _CAPABILITY_FIELDS
    if unknown:
        raise TypeError(f"unknown capability fields {sorted(unknown)}; known: {sorted(_CAPABILITY_FIELDS)}")

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(fn, ATTRIBUTE, dict(capabilities))
        return fn

    return mark


def load_kernel(spec: str) -> Callable[..., Any]:
    """Import ``package.module:function`` (the current directory is importable, as for pytest)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--kernel takes MODULE:FUNCTION, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    try:
        fn = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(fn):
        raise ValueError(f"{spec} is not callable")
    return fn


def capabilities_of(fn: Callable[..., Any]) -> Capabilities:
    params = inspect.signature(fn).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepts = lambda name: takes_all or name in params  # noqa: E731
    missing = [name for name in _LAYOUT_KWARGS if not accepts(name)]
    if missing:
        raise ValueError(f"kernel {getattr(fn, '__name__', fn)!s} must accept keyword arguments {missing}")
    flags: dict[str, Any] = {field: accepts(kw) for kw, field in _OPTION_FLAGS.items()}
    flags["causal"] = (False, True) if accepts("causal") else (False,)
    if "custom_mask" in params:  # named only: a **kwargs kernel keeps drawing what it drew
        flags["custom_mask"] = (False, True)
    if "rope" in params:  # named only, likewise
        flags["rope"] = (False, True)
    fp8 = accepts("k_scale") and accepts("v_scale")
    flags["fp8_scales"] = fp8
    caps = Capabilities(**flags)
    if fp8:
        caps = caps.replace(kv_dtypes=FP8_DTYPES)
    declared = getattr(fn, ATTRIBUTE, {})
    unknown = set(declared) - _CAPABILITY_FIELDS
    if unknown:
        raise ValueError(f"{getattr(fn, '__name__', fn)!s}.{ATTRIBUTE} has unknown fields {sorted(unknown)}")
    return caps.replace(**declared)


class UserKernel(Backend):
    """Adapter around a function with the canonical signature (module docstring)."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"
        self.capabilities = capabilities_of(fn)  # type: ignore[misc]
        self._params = inspect.signature(fn).parameters
        self._takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in self._params.values())

    @classmethod
    def from_spec(cls, spec: str) -> UserKernel:
        return cls(load_kernel(spec), name=spec)

    def import_spec(self) -> tuple[str, str] | None:
        """(module, attribute) by which a standalone script imports the kernel: the ``MODULE:NAME`` the user
        gave (a factory's or wrapper's product, a ``functools.partial``, is importable by that name whatever
        its own ``__name__``), else the function's own names when they are importable; None otherwise."""
        module, sep, attr = self.name.partition(":")
        if sep and module and attr.isidentifier() and module != "__main__" and \
                all(part.isidentifier() for part in module.split(".")):
            owner = sys.modules.get(module)
            if owner is None or getattr(owner, attr, None) is self.fn:
                return module, attr
        module, function = getattr(self.fn, "__module__", None), getattr(self.fn, "__name__", None)
        if not module or not function or module in ("__main__", "builtins") or getattr(self.fn, "__qualname__", None) != function:
            return None  # not importable by name from a standalone script
        return module, function

    def versions(self) -> dict[str, str]:
        spec = self.import_spec()
        module = sys.modules.get(spec[0] if spec else getattr(self.fn, "__module__", ""))
        return {**super().versions(), "kernel": self.name, "module_file": str(getattr(module, "__file__", "?"))}

    def plan(self, case: Case, device: str | torch.device | None = None) -> UserPlan:
        """The case and the tensors the function is given besides q and the caches (int32 index
        tensors, ALiBi slopes and sinks), made once so the judge can checksum them."""
        device = device or self.device or "cpu"
        lay, opts = case.layout, case.options
        index = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
        inputs = {name: index(getattr(lay, name)) for name in _LAYOUT_KWARGS}
        for name in ("alibi_slopes", "sinks"):
            values = getattr(opts, name)
            if values is not None:
                inputs[name] = torch.tensor(values, dtype=torch.float32, device=device)
        masks = case.masks()
        if masks is not None:
            packed, mask_indptr = flashinfer_packed_mask(masks)
            inputs["custom_mask"] = torch.from_numpy(packed).to(device)
            inputs["mask_indptr"] = torch.from_numpy(mask_indptr).to(device)
        return UserPlan(case, inputs)

    def plan_inputs(self, plan: Any) -> dict[str, torch.Tensor]:
        return dict(plan.inputs) if isinstance(plan, UserPlan) else {}

    def run(self, plan: UserPlan | Case, tensors: Tensors) -> KernelOutput:
        device = tensors.q.device
        if isinstance(plan, Case) or any(t.device != device for t in plan.inputs.values()):
            plan = self.plan(plan if isinstance(plan, Case) else plan.case, device)
        case = plan.case
        opts = case.options
        kwargs: dict[str, Any] = {
            **{name: plan.inputs[name] for name in _LAYOUT_KWARGS},
            "causal": opts.causal,
            "sm_scale": case.sm_scale,
            "window_left": opts.window_left,
            "logits_soft_cap": opts.logits_soft_cap,
            "k_scale": opts.k_scale,
            "v_scale": opts.v_scale,
            "alibi_slopes": plan.inputs.get("alibi_slopes"),
            "sinks": plan.inputs.get("sinks"),
        }
        if "custom_mask" in plan.inputs or "custom_mask" in self._params:  # a **kwargs kernel sees none unless masked
            kwargs["custom_mask"], kwargs["mask_indptr"] = plan.inputs.get("custom_mask"), plan.inputs.get("mask_indptr")
        if "rope" in self._params or opts.rope is not None:
            kwargs["rope"] = opts.rope
        k_cache, v_cache = tensors.k_cache, tensors.v_cache
        if "kv_layout" in self._params:  # named only: a **kwargs kernel keeps its NHD caches
            kwargs["kv_layout"] = tensors.kv_layout
            stored = tensors.paged_kv(tensors.kv_layout)
            k_cache, v_cache = (stored[:, 0], stored[:, 1]) if isinstance(stored, torch.Tensor) else stored
        if "paged_kv_cache" in self._params:
            kwargs["paged_kv_cache"] = tensors.kv_cache if "kv_layout" in self._params or tensors.kv_layout == "NHD" else None
        if not self._takes_all:
            kwargs = {k: v for k, v in kwargs.items() if k in self._params}
        result = self.fn(tensors.q, k_cache, v_cache, **kwargs)
        if isinstance(result, torch.Tensor):
            return KernelOutput(result, None)
        if isinstance(result, (tuple, list)) and len(result) == 2:
            return KernelOutput(result[0], result[1])
        shown = f"a {type(result).__name__} of {len(result)}" if isinstance(result, (tuple, list)) else type(result).__name__
        raise ContractViolation(f"{self.name} returned {shown}; expected out or (out, lse)")

    def call_source(self, case: Case) -> str | None:
        """The function imported by its module name and called with the keywords ``run`` passes it."""
        spec = self.import_spec()
        if spec is None:
            return None  # not importable by name from a standalone script
        module, function = spec
        opts = case.options
        if opts.rope is not None:
            return None  # the standalone repro's own reference has no RoPE
        kwargs = {name: f"index({name})" for name in _LAYOUT_KWARGS}
        kwargs.update(causal="causal", sm_scale="sm_scale", window_left="window_left", logits_soft_cap="logits_soft_cap",
                      k_scale="k_scale", v_scale="v_scale")
        if "kv_layout" in self._params:  # the repro's tensors are in the default storage
            kwargs["kv_layout"] = repr("NHD")
        if "paged_kv_cache" in self._params:
            kwargs["paged_kv_cache"] = "None"
        for name, values in (("alibi_slopes", opts.alibi_slopes), ("sinks", opts.sinks)):
            kwargs[name] = "None" if values is None else f"torch.tensor({name}, dtype=torch.float32, device=device)"
        if not self._takes_all:
            kwargs = {k: v for k, v in kwargs.items() if k in self._params}
        args = ",\n    ".join(f"{k}={v}" for k, v in kwargs.items())
        return (f"from {module} import {function}\n\n"
                f"result = {function}(\n    q, k_cache, v_cache,\n    {args},\n)\n"
                "out, lse = (result, None) if isinstance(result, torch.Tensor) else result\n")



@dataclass(frozen=True)
class UserPlan:
    case: Case
    inputs: dict[str, torch.Tensor]  # by keyword: the index tensors, alibi_slopes and sinks if set
