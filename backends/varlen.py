"""``torch.nn.attention.varlen.varlen_attn`` (torch's flash-attention varlen kernel), paged
through ``block_table`` + ``seqused_k``. CUDA only.

Conventions: flash-attn's ``window_size=(left, right)`` with bottom-right alignment; causal is
``(-1, 0)``, FlashInfer's ``window_left = w`` is ``(w, 0)`` (causal) or ``(w, -1)``.
"""

from __future__ import annotations

from typing import Any

import torch
from pa_oracle.backends.base import Backend, Capabilities, KernelOutput, register
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import Tensors


@register
class VarlenAttn(Backend):
    name = "varlen"
    description = "torch varlen_attn with a paged block table (flash-attention)"
    capabilities = Capabilities(
        devices=("cuda",), q_dtypes=("float16", "bfloat16"), head_dim_vo_may_differ=False,
        logits_soft_cap=False, alibi=False, sinks=False, fp8_scales=False,
    )

    def __init__(self) -> None:
        try:
            import inspect

            from torch.nn.attention.varlen import varlen_attn

            self._params = set(inspect.signature(varlen_attn).parameters)
        except ImportError:
            self._params = set()
        if "enable_gqa" not in self._params:  # torch < 2.13: MHA only
            self.capabilities = self.capabilities.replace(max_group_size=1)

    def unavailable_reason(self) -> str | None:
        try:
            from torch.nn.attention.varlen import varlen_attn  # noqa: F401
        except ImportError:
            return f"torch {torch.__version__} has no torch.nn.attention.varlen"
        if not {"block_table", "seqused_k"} <= self._params:
            return f"torch {torch.__version__}'s varlen_attn takes no block_table (no paged KV)"
        return super().unavailable_reason()

    def plan(self, case: Case) -> dict[str, Any]:
        lay, device = case.layout, self.device
        index = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
        opts = case.options
        right = 0 if opts.causal else -1
        return {
            "case": case,
            "cu_seq_q": index(lay.qo_indptr),
            "seqused_k": index(lay.kv_lens),
            "block_table": index(lay.block_table(pad=0)) if max(lay.num_pages_per_request) else index([[0]] * lay.batch_size),
            "window_size": (opts.window_left, right),
        }

    def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
        from torch.nn.attention.varlen import AuxRequest, varlen_attn

        case: Case = plan["case"]
        lay = case.layout
        gqa = {"enable_gqa": True} if "enable_gqa" in self._params else {}
        out, lse = varlen_attn(
            tensors.q, tensors.k_cache, tensors.v_cache, plan["cu_seq_q"], None,
            max(lay.qo_lens), max(max(lay.kv_lens), 1),
            return_aux=AuxRequest(lse=True), scale=case.sm_scale, window_size=plan["window_size"],
            seqused_k=plan["seqused_k"], block_table=plan["block_table"], **gqa,
        )
        if lse.shape[0] == case.heads.num_qo_heads and lse.shape[-1] == lay.total_q:
            lse = lse.transpose(0, 1)  # flash-attn's varlen LSE is [H, total_q]
        return KernelOutput(out, lse.float())
