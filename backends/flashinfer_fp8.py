"""FlashInfer's fa3 paged prefill with an fp8 q (sm90, 0.6.18.post1): q and the KV cache in
float8_e4m3fn on the fp8 tensor-core kernel (``batch_prefill_fp8_sm90.cu``, ``StandardFP8Attention``),
the output in 16 bits.

What 0.6.18's source says, and so what is declared: ``gen_batch_prefill_module`` takes the fp8
template when dtype_q is fp8 (fa3 only: "fp8 tensor core is not supported in fa2 backend"), and
"FP8 output is not supported in fa2/fa3 backends yet": o is float16 or bfloat16, given as
``plan(o_data_type=...)``; q and KV planned in the same fp8 dtype (``test_hopper_fp8_attention.py``).
The scales go in as ``run``'s positional ``*args`` (scale_q [Hq], scale_k [Hkv], scale_v [Hkv] float32,
the test's per-head form: ``BatchPrefillWithPagedKVCacheWrapper.run`` hands ``args[0:3]`` of an fp8 q
to the kernel), not the ``q_scale=`` / ``k_scale=`` keywords (those only multiply sm_scale in Python,
``v_scale=`` the output afterwards). The kernel folds q_scale * k_scale into the logit scale and
v_scale / 448 into the output: P is multiplied by 448 (e4m3's max) and rounded to fp8 before P @ V,
which the tolerance control does too (``pa_oracle.oracle.reference.fp8_probabilities``). No soft cap
(the variant's logits transform is the identity), no ALiBi (fa3), no custom mask; a sliding window
(``test_hopper_fp8_sliding_window.py``); head dims 64, 128, 256, head_dim_vo = head_dim_qk
(``static_assert`` in the fp8 kernel). Only e4m3 is declared (the issue's case; e5m2 q is also built upstream).
"""

from __future__ import annotations

from typing import Any

import torch
from pa_oracle.backends.base import Backend, CompileKey, KernelOutput, register
from pa_oracle.backends.flashinfer import _FLASHINFER, _URI_DTYPE, FlashInferPrefillFA3, build_modules
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import Tensors

FP8_Q = ("float8_e4m3fn",)


def fp8_prefill_uri(key: CompileKey) -> str:
    """The fa3 module an fp8-q key runs on (``get_batch_prefill_uri``: o is not q's dtype here)."""
    v = dict(key)
    q, kv, o, dim = _URI_DTYPE[v["q_dtype"]], _URI_DTYPE[v["kv_dtype"]], _URI_DTYPE[v["o_dtype"]], v["head_dim_qk"]
    return (
        f"batch_prefill_with_kv_cache_dtype_q_{q}_dtype_kv_{kv}_dtype_o_{o}_dtype_idx_i32_head_dim_qk_{dim}_"
        f"head_dim_vo_{dim}_posenc_0_use_swa_{bool(v['window'])}_use_logits_cap_False_f16qk_False_sm90"
    )


@register
class FlashInferPrefillFA3FP8(FlashInferPrefillFA3):
    name = "flashinfer-prefill-fa3-fp8"
    description = "FlashInfer BatchPrefillWithPagedKVCacheWrapper(backend='fa3') with q and KV in float8_e4m3fn, 16-bit output"
    family = "flashinfer-prefill-fa3-fp8"
    capabilities = _FLASHINFER.replace(
        q_dtypes=FP8_Q, kv_dtypes=FP8_Q, o_dtypes=("float16", "bfloat16"), head_dims=(64, 128, 256),
        logits_soft_cap=False, alibi=False,
    )
    compile_fields = ("q_dtype", "kv_dtype", "o_dtype", "head_dim_qk", "window")
    # the CUDA-graph path runs with q-dtype outputs and keyword scales: not this kernel's call
    cuda_graphs = False
    capture_graph = Backend.capture_graph

    def modules(self, key: CompileKey) -> list[str]:
        return [fp8_prefill_uri(key)]

    def build_variants(self, keys: list[CompileKey]) -> list[CompileKey] | None:
        from flashinfer.jit import gen_batch_prefill_module

        specs = []
        for key in keys:
            v = dict(key)
            dtypes = (getattr(torch, v[f]) for f in ("q_dtype", "kv_dtype", "o_dtype"))
            dim = v["head_dim_qk"]
            specs.append(gen_batch_prefill_module("fa3", *dtypes, torch.int32, dim, dim, 0, bool(v["window"]), False, False))
        build_modules(specs)
        return [key for key in keys if self.built_reason(key) is not None]

    def _common_plan_kwargs(self, case: Case) -> dict[str, Any]:
        return {**super()._common_plan_kwargs(case), "o_data_type": getattr(torch, case.options.out_dtype)}

    def run(self, plan: tuple[Case, Any], tensors: Tensors) -> KernelOutput:
        case, wrapper = plan
        heads, opts, device = case.heads, case.options, tensors.q.device
        scales = [
            torch.full((n,), scale, dtype=torch.float32, device=device)
            for n, scale in ((heads.num_qo_heads, opts.q_scale), (heads.num_kv_heads, opts.k_scale), (heads.num_kv_heads, opts.v_scale))
        ]
        out, lse = wrapper.run(tensors.q, self._paged_kv(tensors, self._layout(case)), *scales, return_lse=True)
        return self._finish(case, out, lse)
