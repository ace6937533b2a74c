"""SGLang's default fp8 KV write, as SGLang's own torch copy of it (0.5.10.post1): ``fused_fp8_set_kv_buffer(...,
use_triton=False)`` runs ``_naive_fp8_set_kv_buffer`` (``triton_ops/trtllm_fp8_kv_kernel.py`` lines 420-505),
which its docstring and comments say replicate ``MHATokenToKVPool.set_kv_buffer``
(``mem_cache/memory_pool.py`` lines 1009-1019): the appended values divided by the scale *in their own
dtype* (``div_``), then ``.to(float8_e4m3fn)``, stored as uint8 (SGLang keeps fp8 pools as uint8,
memory_pool.py lines 662-664) by indexing with the slot mapping. Unlike ``set_kv_buffer`` it clones the
values before dividing (line 473), so the caller's K and V are left alone.

Why the copy and not ``set_kv_buffer`` itself: ``memory_pool`` imports ``quantization.fp8_kernel``
(memory_pool.py line 48), which imports ``sgl_kernel`` on CUDA (fp8_kernel.py line 55), a wheel the H200
set does not carry; this module imports with torch and Triton alone (and runs on the CPU).

The adapter hands it the pools as uint8 views (SGLang's storage) ``[pages, page_size, H, D]`` (HND permuted,
a combined pool's halves: views; the writes go through them), the slot mapping and the scales as floats. What
the judge sees is SGLang's rounding: a quotient rounded to bf16 or fp16 first and then to e4m3 (two roundings;
the oracle rounds once). With the drawn scales (at most 3 significant bits) the two agree; with a calibrated
scale such as 0.3 they differ by one e4m3 step on about 1.5% of bf16 values (0.4% of fp16). Not declared:
e5m2 (a uint8 pool is taken as e4m3, line 463-466) and padding rows (SGLang pads with its dummy slot 0; slot
-1 lands in the last page here, line 501).
"""

from __future__ import annotations

import importlib

from pa_oracle.backends.writes import WriteCapabilities, WriteKernel, register
from pa_oracle.backends.writes.sglang_fp8_set_kv import FUNCTION, MODULE, sglang_import_error
from pa_oracle.oracle.append import AppendCase, AppendInputs


@register
class SGLangFP8SetKVTorch(WriteKernel):
    name = "sglang-fp8-set-kv-torch"
    package = "sglang"
    capabilities = WriteCapabilities(dtypes=("float8_e4m3fn",), page_sizes=(1, 2, 5, 16), head_dims=(8, 16, 64))

    def unavailable_reason(self) -> str | None:
        return super().unavailable_reason() or sglang_import_error()

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        import torch

        write = getattr(importlib.import_module(MODULE), FUNCTION)
        k_cache, v_cache = (pool if case.kv_layout == "NHD" else pool.permute(0, 2, 1, 3)
                            for pool in (inputs.k_pool, inputs.v_pool))
        write(inputs.append_k, inputs.append_v, k_cache.view(torch.uint8), v_cache.view(torch.uint8), inputs.slot_mapping,
              k_scale=case.k_scale, v_scale=case.v_scale, page_size=case.page_size, use_triton=False)
