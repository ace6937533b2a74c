"""Scatter by slot mapping in torch (what vLLM's ``reshape_and_cache`` and SGLang's
``set_kv_buffer`` do): ``pool.view(pages * page_size, H, D)[slot_mapping] = k``."""

from __future__ import annotations

from pa_oracle.backends.writes import WriteKernel, register
from pa_oracle.oracle.append import AppendCase, AppendInputs


@register
class TorchScatter(WriteKernel):
    name = "torch-scatter"

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        pages, slots = inputs.slot_mapping // case.page_size, inputs.slot_mapping % case.page_size
        for pool, values in ((inputs.k_pool, inputs.append_k), (inputs.v_pool, inputs.append_v)):
            view = pool if case.kv_layout == "NHD" else pool.permute(0, 2, 1, 3)
            view.index_put_((pages, slots), values)
