"""Fuzz a user's own attention function without writing an adapter.

The function takes the canonical layout directly::

    def my_attention(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                     causal, sm_scale, window_left, logits_soft_cap) -> out | (out, lse)

``q`` [total_q, Hq, Dqk], caches [num_pages, page_size, Hkv, D] (NHD), int32 index tensors on the
same device, ``out`` [total_q, Hq, Dvo] in the case's output dtype (q's; for an fp8 q the drawn one),
``lse`` natural log [total_q, Hq]. Optional keywords, passed when the signature has them (an option the
function does not accept is held at its neutral value for it, never drawn):

- ``alibi_slopes`` / ``sinks`` (float32 [Hq]);
- ``k_scale`` / ``v_scale`` (floats: the KV value is ``stored * scale``; both named: fp8 KV is drawn);
- ``q_scale`` (float: an fp8 q's value is ``stored * q_scale``; 1.0 otherwise) and ``out_dtype`` (the
  ``torch.dtype`` ``out`` must have). Naming both (with the KV scales) draws fp8 q too. An fp8 q of a
  function that does not name ``q_scale`` (one that declared fp8 ``q_dtypes``) gets it folded into
  ``sm_scale`` (exact: the logit is ``sm_scale * q_scale * (q_stored . k)``); without ``sm_scale`` either,
  a case with ``q_scale != 1`` is unsupported for it. An MLA function (below) with an fp8 q gets q as one fp8 row
  ``[q_nope | q_pe]`` under the one ``q_scale`` (both parts quantised once, as vLLM and SGLang quantise an MLA q),
  so folding it into ``sm_scale`` is exact there too.

A function that names ``custom_mask`` (and ``mask_indptr``)
is also given custom-mask cases: FlashInfer's packed form, each request's ``[qo_len, kv_len]``
mask flattened row-major and packed little-endian (uint8), ``mask_indptr`` (int32 [B + 1]) its
byte offsets; None for a case without a mask. ``@declare(mla=(True,))`` asks for MLA cases:
one latent KV head, ``v_cache`` the view ``k_cache[..., :d_ckv]``, q's first ``d_ckv`` dims
``q_nope``, the rest ``q_pe``; every declared ``mla_dims`` pair is drawn (a malformed one is refused by name). A function that names ``rope`` is also given RoPE cases: ``rope`` is
the case's ``pa_oracle.oracle.case.Rope`` (style, theta, scale, rotary_dim) or None, and the function
rotates q and k itself by absolute position (``pa_oracle.oracle.rope``); an MLA function that names ``rope`` gets
MLA RoPE cases (DeepSeek's split): q and the latent cache unrotated, and it rotates only ``q_pe`` and ``kpe`` (the dims
from ``d_ckv`` on; ``rotary_dim`` counts within them, None: all ``d_kpe``), never ``q_nope`` or ``ckv`` (V). One that also names ``positions`` (or
``tree_parents``) is given the draft-tree RoPE cases of EAGLE and Medusa, node ``n`` at ``prefix + depth(n)``
(``Case.positions``): ``positions`` (int32 [total_q]) the queries' RoPE positions (``kv_len - qo_len + i`` but for
such a case), ``key_positions`` (int32 [sum of kv_lens], request-major) the keys' (a request's last ``qo_len`` keys,
its queries' own, at their queries' positions; earlier keys at their index), ``tree_parents`` (int32 [total_q]: each
query's parent within its request, -1 for a root; None for a case without a tree). ``@declare(...)`` narrows
further, with ``Capabilities`` fields::

    @declare(q_dtypes=("bfloat16",), page_sizes=(16, 32), devices=("cuda",))
    def my_attention(...): ...

Memory layouts (views by default): every user kernel is given cases whose tensors lie in another
``Storage`` (``STORAGE_FEATURES``, ``oracle.case``), beside default ones: q may then be a strided view into
a fused QKV buffer and the caches strided views (the halves of one ``[pages, 2, ...]`` tensor, HND memory,
an offset into a larger pool), still indexed ``[num_pages, page_size, Hkv, D]``: a kernel that indexes
through the strides reads them right, one that assumes contiguous memory does not (a finding). A kernel
that raises on such a view while it runs on contiguous copies of the same tensors "refuses views": the case
is unsupported for it (``Unsupported("refuses views ...")``), neither a finding nor a pass; one that raises
on the copies too crashed. ``@declare(storages=("contiguous",))`` opts out; declaring storages explicitly
promises to handle them (an exception on a view is then a crash). A function that names
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
from pa_oracle.backends.base import Backend, Capabilities, ContractViolation, KernelOutput, Unsupported, exception_text
from pa_oracle.oracle.case import FP8_DTYPES, Q_DTYPES, STORAGE_FEATURES, Case, flashinfer_packed_mask
from pa_oracle.oracle.errors import BadInput
from pa_oracle.oracle.rope import key_positions, query_positions
from pa_oracle.oracle.tensors import Tensors, torch_dtype

ATTRIBUTE = "pa_oracle_capabilities"
REFUSES_VIEWS = "refuses views"  # the start of an Unsupported reason: the kernel raised on a view, ran on copies
_CAPABILITY_FIELDS = {f.name for f in fields(Capabilities)}
_OPTION_FLAGS = {  # keyword -> Capabilities field it enables
    "window_left": "window_left",
    "logits_soft_cap": "logits_soft_cap",
    "alibi_slopes": "alibi",
    "sinks": "sinks",
    "sm_scale": "custom_sm_scale",
}
_LAYOUT_KWARGS = ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len")


class BadDeclaration(BadInput):
    """A user kernel's declared capabilities that cannot be drawn as declared; the message names the field."""


def declare(**capabilities: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Narrow what the fuzzer draws for a user kernel (``Capabilities`` field names)."""
    unknown = set(capabilities) - _CAPABILITY_FIELDS
    if unknown:
        raise TypeError(f"unknown capability fields {sorted(unknown)}; known: {sorted(_CAPABILITY_FIELDS)}")
    if "mla_dims" in capabilities:
        check_mla_dims(capabilities["mla_dims"], "declare(mla_dims=...)")

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


def check_mla_dims(pairs: Any, where: str) -> None:
    """Refuse (``BadDeclaration``, naming ``where`` and the pair) MLA dims that cannot be drawn: not a non-empty
    sequence of pairs head_dim_qk > head_dim_vo > 0 (every well-formed declared pair is drawn)."""
    if pairs is None:
        return
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, (tuple, list)) or not pairs:
        raise BadDeclaration(f"{where}: expected a non-empty tuple of (head_dim_qk, head_dim_vo) pairs, got {pairs!r}")
    for pair in pairs:
        ok = isinstance(pair, (tuple, list)) and len(pair) == 2 and all(type(d) is int for d in pair)
        if not ok or not 0 < pair[1] < pair[0]:
            raise BadDeclaration(f"{where}: {pair!r} is not a pair of whole numbers head_dim_qk > head_dim_vo > 0 "
                                 "(MLA: q is [q_nope | q_pe], V the first head_dim_vo dims of the latent cache)")



def capabilities_of(fn: Callable[..., Any]) -> Capabilities:
    """What the fuzzer draws for ``fn``: the options its signature names (module docstring), every storage
    (views by default), narrowed by what it declares."""
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
        flags["rope_positions"] = "positions" in params or "tree_parents" in params  # EAGLE's depth positions
    fp8 = accepts("k_scale") and accepts("v_scale")
    flags["fp8_scales"] = fp8
    caps = Capabilities(**flags, storages=STORAGE_FEATURES)  # views by default
    if fp8:
        caps = caps.replace(kv_dtypes=FP8_DTYPES)
        if "q_scale" in params and "out_dtype" in params:  # named only: it can take an fp8 q and say its output dtype
            caps = caps.replace(q_dtypes=Q_DTYPES + FP8_DTYPES)
    declared = getattr(fn, ATTRIBUTE, {})
    name = f"{getattr(fn, '__name__', fn)!s}.{ATTRIBUTE}"
    unknown = set(declared) - _CAPABILITY_FIELDS
    if unknown:
        raise ValueError(f"{name} has unknown fields {sorted(unknown)}")
    check_mla_dims(declared.get("mla_dims"), f"{name}['mla_dims']")
    return caps.replace(**declared)


class UserKernel(Backend):
    """Adapter around a function with the canonical signature (module docstring)."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"
        self.capabilities = capabilities_of(fn)
        self._params = inspect.signature(fn).parameters
        self._takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in self._params.values())
        # views it did not ask for: one it raises on while it runs on contiguous copies it "refuses" (a skip)
        self._views_by_default = "storages" not in getattr(fn, ATTRIBUTE, {})

    def _accepts(self, name: str) -> bool:
        return self._takes_all or name in self._params

    def unsupported_reason(self, case: Case) -> str | None:
        """The capability misses, and an fp8 q's scale that the function has no keyword to take in."""
        reason = super().unsupported_reason(case)
        if reason is None and case.options.q_scale != 1.0 and not self._accepts("q_scale") and not self._accepts("sm_scale"):
            return f"unsupported: q_scale={case.options.q_scale:g} (the kernel names neither q_scale nor sm_scale to take it)"
        return reason

    def _scales(self, case: Case) -> dict[str, Any]:
        """``sm_scale`` and the scales the case draws; an fp8 q's ``q_scale`` folded into ``sm_scale`` for a
        function that does not name it (the logit is ``sm_scale * q_scale * (q_stored . k)``)."""
        opts = case.options
        sm_scale = case.sm_scale
        if opts.q_scale != 1.0 and not self._accepts("q_scale"):
            if not self._accepts("sm_scale"):
                raise Unsupported(f"q_scale={opts.q_scale:g}: the kernel names neither q_scale nor sm_scale to take it")
            sm_scale *= opts.q_scale
        return {"sm_scale": sm_scale, "k_scale": opts.k_scale, "v_scale": opts.v_scale, "q_scale": opts.q_scale,
                "out_dtype": torch_dtype(opts.out_dtype)}

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
        own_module, function = getattr(self.fn, "__module__", None), getattr(self.fn, "__name__", None)
        if not own_module or not function or own_module in ("__main__", "builtins") or getattr(self.fn, "__qualname__", None) != function:
            return None  # not importable by name from a standalone script
        return own_module, function

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
        inputs.update(self._position_inputs(case, device))
        return UserPlan(case, inputs)

    def _position_inputs(self, case: Case, device: str | torch.device) -> dict[str, torch.Tensor]:
        """``positions``, ``key_positions`` and ``tree_parents`` (int32) for a function that names them (module
        docstring; named only, as ``rope``); a case without a tree has no ``tree_parents``."""
        inputs: dict[str, torch.Tensor] = {}
        as_int32 = lambda a: torch.from_numpy(a).to(device=device, dtype=torch.int32)  # noqa: E731
        if "positions" in self._params:  # named only: a **kwargs kernel is given what it was given before
            inputs["positions"] = as_int32(query_positions(case))
        if "key_positions" in self._params:
            inputs["key_positions"] = as_int32(key_positions(case))
        parents = case.custom_mask.tree_parents if case.custom_mask is not None else None
        if parents is not None and "tree_parents" in self._params:
            inputs["tree_parents"] = torch.tensor([p for tree in parents for p in tree], dtype=torch.int32, device=device)
        return inputs

    def plan_inputs(self, plan: Any) -> dict[str, torch.Tensor]:
        return dict(plan.inputs) if isinstance(plan, UserPlan) else {}

    def run(self, plan: UserPlan | Case, tensors: Tensors) -> KernelOutput:
        device = tensors.q.device
        if isinstance(plan, Case) or any(t.device != device for t in plan.inputs.values()):
            plan = self.plan(plan if isinstance(plan, Case) else plan.case, device)
        case = plan.case
        kwargs = self._keywords(plan)
        q, k_cache, v_cache = tensors.q, tensors.k_cache, tensors.v_cache
        if "kv_layout" in self._params:  # named only: a **kwargs kernel keeps its NHD caches
            kwargs["kv_layout"] = tensors.kv_layout
            stored = tensors.paged_kv(tensors.kv_layout)
            k_cache, v_cache = (stored[:, 0], stored[:, 1]) if isinstance(stored, torch.Tensor) else stored
        if "paged_kv_cache" in self._params:
            kwargs["paged_kv_cache"] = tensors.kv_cache if "kv_layout" in self._params or tensors.kv_layout == "NHD" else None
        if not self._takes_all:
            kwargs = {k: v for k, v in kwargs.items() if k in self._params}
        try:
            result = self.fn(q, k_cache, v_cache, **kwargs)
        except Exception as exc:
            if case.storage is None or not self._views_by_default or not self._runs_contiguous((q, k_cache, v_cache), kwargs,
                                                                                                  latent=tensors.v_is_latent_view()):
                raise
            text = exception_text(exc).splitlines()[0][:200] if exception_text(exc).strip() else "no message"
            raise Unsupported(f"{REFUSES_VIEWS}: {type(exc).__name__} on storage {case.storage.label()} ({text}); "
                              "it runs on contiguous copies") from exc
        if isinstance(result, torch.Tensor):
            return KernelOutput(result, None)
        if isinstance(result, (tuple, list)) and len(result) == 2:
            return KernelOutput(result[0], result[1])
        shown = f"a {type(result).__name__} of {len(result)}" if isinstance(result, (tuple, list)) else type(result).__name__
        raise ContractViolation(f"{self.name} returned {shown}; expected out or (out, lse)")

    def _keywords(self, plan: UserPlan) -> dict[str, Any]:
        """Every keyword the function may be given for ``plan``'s case (``run`` keeps those it names)."""
        case = plan.case
        opts = case.options
        kwargs: dict[str, Any] = {
            **{name: plan.inputs[name] for name in _LAYOUT_KWARGS},
            "causal": opts.causal,
            "window_left": opts.window_left,
            "logits_soft_cap": opts.logits_soft_cap,
            **self._scales(case),
            "alibi_slopes": plan.inputs.get("alibi_slopes"),
            "sinks": plan.inputs.get("sinks"),
        }
        if "custom_mask" in plan.inputs or "custom_mask" in self._params:  # a **kwargs kernel sees none unless masked
            kwargs["custom_mask"], kwargs["mask_indptr"] = plan.inputs.get("custom_mask"), plan.inputs.get("mask_indptr")
        if "rope" in self._params or opts.rope is not None:
            kwargs["rope"] = opts.rope
        for name in ("positions", "key_positions", "tree_parents"):  # named only; None only for tree_parents
            if name in self._params:
                kwargs[name] = plan.inputs.get(name)
        return kwargs

    def _runs_contiguous(self, views: tuple[torch.Tensor, ...], kwargs: dict[str, Any], *, latent: bool) -> bool:
        """Whether the same call runs (raises nothing) on contiguous copies of ``views`` (q, the caches; MLA's V
        again a view of the latent cache; a combined ``paged_kv_cache`` copied too). Its output is not judged."""
        q, k_cache, v_cache = (t.contiguous() for t in views)
        if latent:
            v_cache = k_cache[..., : views[2].shape[-1]]
        again = dict(kwargs)
        if isinstance(again.get("paged_kv_cache"), torch.Tensor):
            again["paged_kv_cache"] = again["paged_kv_cache"].contiguous()
        try:
            self.fn(q, k_cache, v_cache, **again)
        except Exception:  # noqa: BLE001 - it fails on default memory too: the first exception is the crash
            return False
        return True

    def call_source(self, case: Case) -> str | None:
        """The function imported by its module name and called with the keywords ``run`` passes it."""
        spec = self.import_spec()
        if spec is None:
            return None  # not importable by name from a standalone script
        module, function = spec
        opts = case.options
        if opts.rope is not None or opts.q_scale != 1.0:
            return None  # the standalone repro's own reference has no RoPE and no q_scale
        kwargs = {name: f"index({name})" for name in _LAYOUT_KWARGS}
        kwargs.update(causal="causal", sm_scale="sm_scale", window_left="window_left", logits_soft_cap="logits_soft_cap",
                      k_scale="k_scale", v_scale="v_scale", q_scale="1.0", out_dtype=f"torch.{opts.out_dtype}")
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
