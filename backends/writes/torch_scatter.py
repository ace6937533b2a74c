"""Scatter by slot mapping in torch (what vLLM's ``reshape_and_cache`` and SGLang's
``set_kv_buffer`` do): ``pool.view(pages * page_size, H, D)[slot_mapping] = k``, skipping padding
rows (slot -1) and quantising to an fp8 cache as ``value / scale`` (in float32, as vLLM does)."""

from __future__ import annotations

from pa_oracle.backends.writes import WriteCapabilities, WriteKernel, register
from pa_oracle.oracle.append import CACHE_DTYPES, AppendCase, AppendInputs


@register
class TorchScatter(WriteKernel):
    name = "torch-scatter"
    capabilities = WriteCapabilities(dtypes=CACHE_DTYPES, padding=True)

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        real = inputs.slot_mapping >= 0
        slots = inputs.slot_mapping[real]
        pages, within = slots // case.page_size, slots % case.page_size
        for pool, values, scale in ((inputs.k_pool, inputs.append_k, case.k_scale), (inputs.v_pool, inputs.append_v, case.v_scale)):
            values = values[real]
            if case.quantised:
                values = (values.float() / scale).to(pool.dtype)
            view = pool if case.kv_layout == "NHD" else pool.permute(0, 2, 1, 3)
            view.index_put_((pages, within), values)
