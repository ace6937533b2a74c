"""SGLang's fused fp8 KV write (0.5.10.post1): ``fused_fp8_set_kv_buffer`` in
``sglang/srt/layers/attention/triton_ops/trtllm_fp8_kv_kernel.py``, the Triton kernel its TRT-LLM MHA backend
writes an ``float8_e4m3fn`` cache with (``trtllm_mha_backend.py`` lines 552-554). It quantises itself:
``(value * inv_scale).to(tl.float8e4nv)`` (line 72) with ``inv_scale = 1 / scale`` in float32 (line 370):
the product in float32, rounded once to e4m3 (within ``oracle.append.FP8_SLACK`` of the float64 quotient).
``cache_loc`` is the slot mapping (``page * page_size + slot``, int32 by its docstring), the caches
``[total_slots, H, D]`` (SGLang's own pool) or ``[num_pages, page_size, H, D]`` with their strides read
(lines 296-324).

The adapter passes the case's scales as floats, the slot mapping as int32, the caches as SGLang's
``[total_slots, H, D]`` when the pool is contiguous NHD and as a 4-D ``[pages, page_size, H, D]`` view
otherwise (HND permuted, a combined pool's halves): the strides it reads say where each slot is.

Head groups, the adapter's: ``BLOCK_HEAD = min(num_kv_heads, 8)`` (line 340) is a ``tl.arange`` bound
(line 54), which Triton requires to be a power of two, so 3, 5, 6 or 7 KV heads do not compile. For those
the adapter calls the kernel once per power-of-two group of heads (3 = 2 + 1, on head-sliced views of the
same tensors); placement within each group, scales and rounding are still the kernel's. Not declared:
e5m2 (the kernel casts to e4m3 only, line 72) and padding rows (SGLang pads with its dummy slot 0, not -1;
slot -1 is an out-of-bounds store here, line 144).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import TYPE_CHECKING

from pa_oracle.backends.base import exception_text
from pa_oracle.backends.writes import WriteCapabilities, WriteKernel, register
from pa_oracle.oracle.append import AppendCase, AppendInputs

if TYPE_CHECKING:
    import torch

MODULE = "sglang.srt.layers.attention.triton_ops.trtllm_fp8_kv_kernel"
FUNCTION = "fused_fp8_set_kv_buffer"


@functools.cache
def sglang_import_error() -> str | None:
    """Why ``MODULE`` cannot be imported here (None: it can). Imported once, so that a missing dependency of
    SGLang makes its kernels unavailable, never a crash finding on every case."""
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not installed"
    try:
        getattr(importlib.import_module(MODULE), FUNCTION)
    except Exception as exc:  # noqa: BLE001 - any failure to import is "unavailable here", said with its cause
        return f"{MODULE}.{FUNCTION} does not import here ({type(exc).__name__}: {exception_text(exc)})"
    return None


def head_groups(num_kv_heads: int) -> list[slice]:
    """The heads in power-of-two groups, largest first (one group when ``min(heads, 8)`` is a power of two)."""
    if num_kv_heads >= 8 or num_kv_heads & (num_kv_heads - 1) == 0:
        return [slice(0, num_kv_heads)]
    groups, start = [], 0
    while start < num_kv_heads:
        size = 1 << ((num_kv_heads - start).bit_length() - 1)
        groups.append(slice(start, start + size))
        start += size
    return groups


def sglang_cache(case: AppendCase, pool: torch.Tensor, heads: slice) -> torch.Tensor:
    """``pool``'s ``heads`` as SGLang addresses a slot: ``[total_slots, H, D]`` when that is a view of it
    (contiguous NHD), else ``[pages, page_size, H, D]`` with the pool's strides."""
    nhd = pool if case.kv_layout == "NHD" else pool.permute(0, 2, 1, 3)
    nhd = nhd[:, :, heads]
    return nhd.view(-1, *nhd.shape[2:]) if nhd.is_contiguous() else nhd


@register
class SGLangFP8SetKV(WriteKernel):
    name = "sglang-fp8-set-kv"
    package = "sglang"
    capabilities = WriteCapabilities(dtypes=("float8_e4m3fn",), page_sizes=(1, 5, 16), devices=("cuda",),
                                     head_dims=(64, 128, 256))

    def unavailable_reason(self) -> str | None:
        return super().unavailable_reason() or sglang_import_error()

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        import torch

        write = getattr(importlib.import_module(MODULE), FUNCTION)
        cache_loc = inputs.slot_mapping.to(torch.int32)
        for heads in head_groups(case.num_kv_heads):
            write(inputs.append_k[:, heads], inputs.append_v[:, heads], sglang_cache(case, inputs.k_pool, heads),
                  sglang_cache(case, inputs.v_pool, heads), cache_loc, k_scale=case.k_scale, v_scale=case.v_scale,
                  page_size=case.page_size)
