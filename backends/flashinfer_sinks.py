"""FlashInfer's ``BatchAttentionWithAttentionSinkWrapper`` (0.6.18: ``flashinfer.attention``), the
sink-aware paged prefill/decode of gpt-oss, ``fa2``.

The wrapper is a JIT variant fixed at construction (dtypes, head dims, sliding window on or off);
``run(q, kv, sink, sm_scale)`` takes the per-qo-head sink logits (float32 ``[Hq]``) and the scale as
the variant's extra arguments. Its LSE is not returned: whether it includes the sink is not
documented, and the output alone shows a sink ignored or misindexed. Only cases with sinks are
drawn (a case without is the plain prefill's).
"""

from __future__ import annotations

from typing import Any

import torch
from pa_oracle.backends.base import KernelOutput, register
from pa_oracle.backends.flashinfer import _FLASHINFER, FlashInferPrefillFA2, _workspace
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import Tensors


@register
class FlashInferSinks(FlashInferPrefillFA2):
    name = "flashinfer-sinks"
    description = "FlashInfer BatchAttentionWithAttentionSinkWrapper(backend='fa2')"
    capabilities = _FLASHINFER.replace(
        sinks=True, alibi=False, logits_soft_cap=False, kv_dtypes=None, fp8_scales=False, returns_lse=False,
    )
    cuda_graphs = False

    def unsupported_reason(self, case: Case) -> str | None:
        reason = super().unsupported_reason(case)
        if reason is None and case.options.sinks is None:
            return "unsupported: no sinks (the sink wrapper is tested on sink cases only)"
        return reason

    def plan(self, case: Case) -> tuple[Case, Any]:
        from flashinfer.attention import BatchAttentionWithAttentionSinkWrapper

        device = self.device or "cuda"
        dtype = getattr(torch, case.options.q_dtype)
        wrapper = BatchAttentionWithAttentionSinkWrapper(
            _workspace(device), kv_layout=self.kv_layout, backend="fa2", q_data_type=dtype, kv_data_type=dtype,
            head_dim_qk=case.heads.head_dim_qk, head_dim_vo=case.heads.head_dim_vo, window_left=case.options.window_left,
        )
        return case, self._planned(wrapper, case, device)

    def run(self, plan: tuple[Case, Any], tensors: Tensors) -> KernelOutput:
        case, wrapper = plan
        sinks = torch.tensor(case.options.sinks, dtype=torch.float32, device=tensors.q.device)
        out = wrapper.run(tensors.q, self._paged_kv(tensors), sinks, case.sm_scale)
        return KernelOutput(out[0] if isinstance(out, tuple) else out, None)

    def write_layout(self, plan: Any, case: Case) -> None:
        raise NotImplementedError(f"{self.name}: not checked for in-place layout rewrites")
