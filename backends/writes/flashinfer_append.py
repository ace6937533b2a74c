"""FlashInfer ``append_paged_kv_cache`` (page.py in 0.6.18.post1): ragged ``append_key``/``append_value``
with ``batch_indices`` and ``positions`` (from ``get_batch_indices_positions``), the pool as a
``(k, v)`` pair or one ``[pages, 2, ...]`` tensor, ``kv_indices``/``kv_indptr``/``kv_last_page_len``
that already count the appended tokens, ``kv_layout`` NHD or HND. The adapter passes the case's
own batch indices and positions (the documented values), so a wrong helper cannot hide a bug. The kernel
copies the appended values as the cache's dtype (f16, bf16 or fp8; no float32, no scale): an fp8 cache is
``flashinfer-append-fp8``. No padding rows: the kernel has no skip for ``batch_indices`` -1 (see there)."""

from __future__ import annotations

from pa_oracle.backends.writes import WriteCapabilities, WriteKernel, register
from pa_oracle.oracle.append import AppendCase, AppendInputs


@register
class FlashInferAppend(WriteKernel):
    name = "flashinfer-append"
    package = "flashinfer"
    capabilities = WriteCapabilities(dtypes=("bfloat16", "float16"), page_sizes=(1, 5, 16), devices=("cuda",),
                                     head_dims=(64, 128))  # DISPATCH_HEAD_DIM (utils.cuh): 64, 128, 256, 512

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        import flashinfer

        flashinfer.append_paged_kv_cache(
            inputs.append_k, inputs.append_v, inputs.batch_indices, inputs.positions, inputs.pool,
            inputs.kv_indices, inputs.kv_indptr, inputs.kv_last_page_len, kv_layout=case.kv_layout,
        )
