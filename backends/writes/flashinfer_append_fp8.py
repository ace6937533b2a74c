"""FlashInfer ``append_paged_kv_cache`` into an fp8 cache (0.6.18.post1), at the library's convention: it
copies bytes and never quantises. ``csrc/page.cu`` (``append_paged_kv_cache``, lines 94-106) dispatches on
the *cache's* dtype (``DISPATCH_DLPACK_DTYPE_TO_CTYPE``: f16, bf16, fp8 e4m3 and e5m2, enabled for every JIT
module by ``jit/core.py`` lines 547-550) and reads ``append_key``/``append_value`` as that same type without
checking their dtype; ``include/flashinfer/page.cuh`` ``AppendPagedKVCacheKernel`` (lines 395-420) is a
``vec_t::memcpy``; the function takes no scale (an fp8 cache's ``k_scale``/``v_scale`` are applied when
attention reads it). So the appended values must already be fp8.

The conversion is this adapter's: ``append_k.float() / k_scale`` rounded to the cache's fp8 format by torch
(nearest, ties to even; torch gives NaN past the largest finite value, which the drawn scales never reach),
as vLLM's ``reshape_and_cache`` and SGLang quantise, then handed to the kernel. The judge therefore checks
the adapter's rounding and the kernel's *placement*: which bytes of which page, slot and head the 1-byte
instantiation (``vec_size`` 16, ``head_dim / 16`` threads a head) writes, and that nothing else changes. It
is not a judgement of a FlashInfer quantiser (there is none on this path; ``nvfp4_quantize_append_paged_kv_cache``
is NVFP4, a format the write oracle does not model).

Not declared: padding rows. The kernel reads ``kv_indptr[batch_indices[i]]`` for every row with no skip for
-1 (``page.cuh`` line 410), although ``get_batch_indices_positions`` (``page.py`` lines 305-322) leaves
-1 in rows past ``append_indptr[-1]``: a padded row is out of contract, not a tested case.
"""

from __future__ import annotations

from pa_oracle.backends.writes import WriteCapabilities, WriteKernel, register
from pa_oracle.oracle.append import FP8_CACHE_DTYPES, AppendCase, AppendInputs


@register
class FlashInferAppendFP8(WriteKernel):
    name = "flashinfer-append-fp8"
    package = "flashinfer"
    capabilities = WriteCapabilities(dtypes=FP8_CACHE_DTYPES, page_sizes=(1, 5, 16), devices=("cuda",),
                                     head_dims=(64, 128, 256))  # DISPATCH_HEAD_DIM (utils.cuh): 64, 128, 256, 512

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        import flashinfer

        fp8 = inputs.k_pool.dtype
        append_k = (inputs.append_k.float() / case.k_scale).to(fp8)
        append_v = (inputs.append_v.float() / case.v_scale).to(fp8)
        flashinfer.append_paged_kv_cache(
            append_k, append_v, inputs.batch_indices, inputs.positions, inputs.pool,
            inputs.kv_indices, inputs.kv_indptr, inputs.kv_last_page_len, kv_layout=case.kv_layout,
        )
