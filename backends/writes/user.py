"""Fuzz a user's own KV-cache write without writing an adapter: ``pa-oracle writes --kernel MODULE:NAME``.

``NAME`` is a ``WriteKernel`` subclass (or instance), used as it is, or a function that writes in place::

    def my_write(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale) -> None

``key``/``value`` [tokens, Hkv, D] are the appended rows; ``k_cache``/``v_cache`` the pools
[num_pages, page_size, Hkv, D] (NHD), written in place. Keywords, passed when the signature names them
(or takes ``**kwargs``): ``slot_mapping`` (int64 [tokens]: page * page_size + slot, -1 for a padding row),
``kv_indices``/``kv_indptr``/``kv_last_page_len`` (int32, the page table after the append),
``batch_indices``/``positions`` (int32 [tokens], -1 for a padding row), ``page_size``, ``kv_layout``,
``k_scale``/``v_scale`` (floats) and ``paged_kv_cache`` (the one ``[num_pages, 2, ...]`` tensor of a
combined pool, else None). The signature says what is drawn: a function that names ``kv_layout`` also gets
HND pools (``[num_pages, Hkv, page_size, D]``); one that names ``k_scale`` and ``v_scale`` also gets fp8
caches (``float8_e4m3fn``/``float8_e5m2``) that it must quantise on write (``stored = value / scale``, as
vLLM's ``reshape_and_cache``), with ``key``/``value`` in bf16, fp16 or fp32; one that names
``slot_mapping`` also gets padding rows (slot -1, CUDA-graph padding), which it must not store. Every user
kernel gets the K and V halves of one ``[num_pages, 2, ...]`` tensor (strided views) as well as two
tensors: a write that assumes contiguous pools is a finding. ``@declare_write(...)`` narrows with
``WriteCapabilities`` fields::

    @declare_write(dtypes=("bfloat16",), page_sizes=(16,), devices=("cuda",))
    def my_write(...): ...
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from pa_oracle.backends.user import load_kernel
from pa_oracle.backends.writes.base import CAPABILITY_FIELDS, WriteCapabilities, WriteKernel
from pa_oracle.oracle.append import CACHE_DTYPES, DTYPES, LAYOUTS, AppendCase, AppendInputs

ATTRIBUTE = "pa_oracle_write_capabilities"
_TENSORS = ("slot_mapping", "kv_indices", "kv_indptr", "kv_last_page_len", "batch_indices", "positions")
_ADDRESSING = (("slot_mapping",), ("kv_indices", "kv_indptr", "batch_indices", "positions"))  # one of them is needed


def declare_write(**capabilities: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Narrow what the fuzzer draws for a user write function (``WriteCapabilities`` field names)."""
    if unknown := set(capabilities) - CAPABILITY_FIELDS:
        raise TypeError(f"unknown write capability fields {sorted(unknown)}; known: {sorted(CAPABILITY_FIELDS)}")

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(fn, ATTRIBUTE, dict(capabilities))
        return fn

    return mark


def write_capabilities_of(fn: Callable[..., Any]) -> WriteCapabilities:
    """What to draw for ``fn``, from the keywords it names (module docstring) and its ``declare_write``."""
    params = inspect.signature(fn).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepts = lambda name: takes_all or name in params  # noqa: E731
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params.values())
    if len(positional) < 4 and not varargs:
        raise ValueError(f"write kernel {getattr(fn, '__name__', fn)!s} must take (key, value, k_cache, v_cache) positionally")
    if not any(all(accepts(name) for name in group) for group in _ADDRESSING):
        raise ValueError(f"write kernel {getattr(fn, '__name__', fn)!s} must accept the keyword slot_mapping, "
                         "or kv_indices, kv_indptr, batch_indices and positions")
    caps = WriteCapabilities(
        layouts=LAYOUTS if accepts("kv_layout") else ("NHD",),
        dtypes=CACHE_DTYPES if accepts("k_scale") and accepts("v_scale") else DTYPES,
        padding=accepts("slot_mapping"),
    )
    declared = getattr(fn, ATTRIBUTE, {})
    if unknown := set(declared) - CAPABILITY_FIELDS:
        raise ValueError(f"{getattr(fn, '__name__', fn)!s}.{ATTRIBUTE} has unknown fields {sorted(unknown)}")
    return caps.replace(**declared)


class UserWriteKernel(WriteKernel):
    """A write function with the signature of the module docstring, as a ``WriteKernel``."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn = fn
        self.name = name
        self.capabilities = write_capabilities_of(fn)
        params = inspect.signature(fn).parameters
        self._takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self._params = set(params)

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        kwargs: dict[str, Any] = {name: getattr(inputs, name) for name in _TENSORS}
        kwargs.update(page_size=case.page_size, kv_layout=case.kv_layout, k_scale=case.k_scale, v_scale=case.v_scale,
                      paged_kv_cache=inputs.pool if case.combined else None)
        if not self._takes_all:
            kwargs = {k: v for k, v in kwargs.items() if k in self._params}
        result = self.fn(inputs.append_k, inputs.append_v, inputs.k_pool, inputs.v_pool, **kwargs)
        if result is not None:
            raise TypeError(f"{self.name} returned a {type(result).__name__}; a write kernel writes its pools in place "
                            "and returns None")


def user_write_kernel(spec: str) -> WriteKernel:
    """The write kernel ``MODULE:NAME`` names: a ``WriteKernel`` subclass (made with no arguments) or
    instance, or a write function (``UserWriteKernel``); named ``spec`` either way."""
    target = load_kernel(spec)
    if isinstance(target, type):
        if not issubclass(target, WriteKernel):
            raise ValueError(f"{spec} is a class but not a WriteKernel (pa_oracle.backends.writes)")
        kernel = target()
    elif isinstance(target, WriteKernel):
        kernel = target
    else:
        kernel = UserWriteKernel(target, spec)
    kernel.name = spec  # (on the instance: how a worker process loads it again, and how a finding names it)
    return kernel
