"""FlashInfer's ``BatchAttentionWithAttentionSinkWrapper`` (0.6.18: ``flashinfer.attention``), the
sink-aware paged prefill/decode of gpt-oss, ``fa2``.

The wrapper is a JIT variant fixed at construction (dtypes, head dims, sliding window on or off);
``run(q, kv, sink, sm_scale)`` takes the per-qo-head sink logits (float32 ``[Hq]``) and the scale as
the variant's extra arguments. Its LSE is not returned: whether it includes the sink is not
documented, and the output alone shows a sink ignored or misindexed. Only cases with sinks are
drawn (a case without is the plain prefill's).

Compiled variants (0.6.18 ``attention/_core.py``): one JIT module per
``batch_prefill_attention_sink_{q dtype}_swa_{window}_{backend}``. That name holds neither the head dims
nor the KV dtype, while the generated sources (``batch_prefill_config.inc``) do: one folder, rebuilt
whenever another head dim is asked for. So a key is "cached" only when the folder's config is for its
head dim, and a campaign's keys differ in head dim from one another at most as its drawing chooses.
"""

from __future__ import annotations

from typing import Any

import torch
from pa_oracle.backends.base import CompileKey, KernelOutput, register
from pa_oracle.backends.flashinfer import _FLASHINFER, _URI_DTYPE, FlashInferPrefillFA2, _workspace
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
    compile_fields = ("q_dtype", "head_dim_qk", "window", "sinks")

    def sink_uri(self, key: CompileKey) -> str:
        """The name FlashInfer 0.6.18 gives the sink module of ``key`` (no head dims, no KV dtype in it)."""
        v = dict(key)
        return f"batch_prefill_attention_sink_{_URI_DTYPE[v['q_dtype']]}_swa_{bool(v['window'])}_fa2"

    def modules(self, key: CompileKey) -> list[str]:
        return [self.sink_uri(key)]

    def build_variants(self, keys: list[CompileKey]) -> list[CompileKey] | None:
        return None  # not the plain prefill's JitSpec: the warm-up builds by judging one case per key

    def built_reason(self, key: CompileKey) -> str | None:
        v = dict(key)
        if not v["sinks"]:
            return "refused: no sinks (the sink wrapper is tested on sink cases only)"
        try:
            from flashinfer.jit import env
        except Exception:  # noqa: BLE001 - no flashinfer here: nothing is known to be built
            return None
        uri = self.sink_uri(key)
        config = env.FLASHINFER_GEN_SRC_DIR / uri / "batch_prefill_config.inc"
        built = (env.FLASHINFER_JIT_DIR / uri / f"{uri}.so").exists() and config.exists()
        return "cached" if built and f"HEAD_DIM_QK = {v['head_dim_qk']};" in config.read_text() else None

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
