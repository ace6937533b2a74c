"""``torch.nn.functional.scaled_dot_product_attention`` on any device, one padded batch call.

One backend per SDPA kernel that takes an arbitrary mask: ``sdpa-math`` (the composite math
path, any device), ``sdpa-flash`` (CPU's fused ATen flash kernel; CUDA's flash kernel takes no
mask, so it cannot run a ragged batch) and ``sdpa-efficient`` (CUDA's memory-efficient kernel). The adapter pages K/V into dense tensors,
expresses causal (bottom-right), window and ALiBi as one boolean or float mask, and GQA through
``enable_gqa``. SDPA has no soft cap, no sinks, no LSE and needs the K/V dtype of the query.
``sdpa-efficient`` declares every ``Storage``: the adapter's own gather (``_dense``) reads the pages
through their views, whatever the memory layout (what it tests is that gather, not SDPA's strides).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from pa_oracle.backends._dense import Dense, alibi_bias, from_dense, keep_mask, to_dense
from pa_oracle.backends.base import Backend, Capabilities, GraphCall, KernelOutput, capture_cuda_graph, register
from pa_oracle.oracle.case import STORAGE_FEATURES, Case
from pa_oracle.oracle.tensors import Tensors
from torch.nn.attention import SDPBackend, sdpa_kernel

_SDPA = Capabilities(logits_soft_cap=False, sinks=False, fp8_scales=False, returns_lse=False)


class _Sdpa(Backend):
    kernel: ClassVar[SDPBackend]
    native_gqa: ClassVar[bool] = True  # False: the kernel takes no enable_gqa; KV heads are repeated here

    def _mask(self, case: Case, dense: Dense) -> torch.Tensor:
        keep = keep_mask(case, dense)[:, None]  # [B, 1, max_q, max_kv]
        if case.options.alibi_slopes is None:
            return keep
        return torch.where(keep, alibi_bias(case, dense, torch.float32), float("-inf")).to(dense.q.dtype)

    def _inputs(self, case: Case, dense: Dense) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k, v = dense.k, dense.v
        if not self.native_gqa:
            k, v = (x.repeat_interleave(case.heads.group_size, dim=1) for x in (k, v))
        return dense.q, k, v

    def _sdpa(self, case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(self.kernel):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=case.sm_scale, enable_gqa=self.native_gqa)

    def run(self, plan: Case, tensors: Tensors) -> KernelOutput:
        case = plan
        dense = to_dense(case, tensors)
        return KernelOutput(from_dense(case, self._sdpa(case, *self._inputs(case, dense), self._mask(case, dense))), None)

    def capture_graph(self, case: Case, tensors: Tensors) -> GraphCall:
        """The SDPA call on static dense tensors; paging them in (``load``) stays outside the graph."""
        dense = to_dense(case, tensors)
        mask = self._mask(case, dense)  # depends on the layout only
        q, k, v = (x.clone() for x in self._inputs(case, dense))

        def load(new: Tensors) -> None:
            for target, source in zip((q, k, v), self._inputs(case, to_dense(case, new))):
                target.copy_(source)

        launch = lambda: (self._sdpa(case, q, k, v, mask), None)
        replay, outputs = capture_cuda_graph(launch)
        rows = lambda raw: (from_dense(case, raw[0]), None)
        return GraphCall(load=load, launch=launch, replay=replay, outputs=outputs, rows=rows,
                         finish=lambda raw: KernelOutput(*rows(raw)))


@register
class SdpaMath(_Sdpa):
    name = "sdpa-math"
    description = "torch SDPA, math backend"
    kernel = SDPBackend.MATH
    capabilities = _SDPA


@register
class SdpaFlash(_Sdpa):
    name = "sdpa-flash"
    description = "torch SDPA, fused flash-attention backend (CPU ATen kernel or CUDA)"
    kernel = SDPBackend.FLASH_ATTENTION
    capabilities = _SDPA.replace(devices=("cpu",), head_dim_vo_may_differ=False)


@register
class SdpaEfficient(_Sdpa):
    name = "sdpa-efficient"
    description = "torch SDPA, memory-efficient attention backend (CUDA)"
    kernel = SDPBackend.EFFICIENT_ATTENTION
    native_gqa = False  # "No available kernel" with enable_gqa=True (seen on the H200, torch 2.11)
    capabilities = _SDPA.replace(devices=("cuda",), storages=STORAGE_FEATURES)
    cuda_graphs = True
