"""``torch.nn.functional.scaled_dot_product_attention`` on any device, one padded batch call.

One backend per SDPA kernel that takes an arbitrary mask: ``sdpa-math`` (the composite math
path, any device), ``sdpa-flash`` (CPU's fused ATen flash kernel; CUDA's flash kernel takes no
mask, so it cannot run a ragged batch) and ``sdpa-efficient`` (CUDA's memory-efficient kernel). The adapter pages K/V into dense tensors,
expresses causal (bottom-right), window and ALiBi as one boolean or float mask, and GQA through
``enable_gqa``. SDPA has no soft cap, no sinks, no LSE and needs the K/V dtype of the query.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from backends._dense import alibi_bias, from_dense, keep_mask, to_dense
from backends.base import Backend, Capabilities, KernelOutput, register
from oracle.case import Case
from oracle.tensors import Tensors

_SDPA = Capabilities(logits_soft_cap=False, sinks=False, fp8_scales=False, returns_lse=False)


class _Sdpa(Backend):
    kernel: ClassVar[SDPBackend]
    native_gqa: ClassVar[bool] = True  # False: the kernel takes no enable_gqa; KV heads are repeated here

    def run(self, plan: Case, tensors: Tensors) -> KernelOutput:
        case = plan
        dense = to_dense(case, tensors)
        keep = keep_mask(case, dense)[:, None]  # [B, 1, max_q, max_kv]
        mask: torch.Tensor = keep
        if case.options.alibi_slopes is not None:
            bias = alibi_bias(case, dense, torch.float32)
            mask = torch.where(keep, bias, float("-inf")).to(tensors.q.dtype)
        k, v = dense.k, dense.v
        if not self.native_gqa:
            k, v = (x.repeat_interleave(case.heads.group_size, dim=1) for x in (k, v))
        with sdpa_kernel(self.kernel):
            out = F.scaled_dot_product_attention(
                dense.q, k, v, attn_mask=mask, scale=case.sm_scale, enable_gqa=self.native_gqa
            )
        return KernelOutput(from_dense(case, out), None)


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
    capabilities = _SDPA.replace(devices=("cuda",))
