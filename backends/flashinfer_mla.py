"""FlashInfer's ``BatchMLAPagedAttentionWrapper`` (absorbed MLA decode / incremental prefill),
``fa2`` and, on sm90, ``fa3``.

The case's latent cache ``[num_pages, page, 1, d_ckv + d_kpe]`` is handed over as the two views
FlashInfer takes, ``ckv_cache = k_cache[:, :, 0, :d_ckv]`` and ``kpe_cache = k_cache[:, :, 0, d_ckv:]``
(strided views of one buffer, as serving engines pass them), and q as ``q_nope = q[..., :d_ckv]``,
``q_pe = q[..., d_ckv:]``. ``kv_len_arr`` is the layout's ``kv_lens``; FlashInfer's LSE is base 2
(converted here). fp8 (e4m3, bf16 q, 512/64 only, sm90) passes ``ckv_scale = kpe_scale = k_scale``:
one latent cache has one scale, so ``v_scale`` must equal it.

Compiled variants (0.6.18 ``flashinfer/jit/attention/modules.py`` ``get_batch_mla_uri``): one module
per (backend, q dtype, kv dtype, o dtype = q's, index dtype int32, ``head_dim_ckv``, ``head_dim_kpe``,
profiler off); ``causal`` and ``sm_scale`` are plan-time arguments of that one module. The dims are
the one pair the adapter declares, so the compile key is (q dtype, kv dtype), and
``build_variants`` builds those modules ahead (``warmup``, a campaign's compile budget); the
fp16 q + fp8 key, whose cases FlashInfer refuses, is left out of the plan.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pa_oracle.backends.base import Backend, Capabilities, CompileKey, KernelOutput, register
from pa_oracle.backends.flashinfer import _URI_DTYPE, LN_2, _workspace, build_modules, built_module
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import Tensors


@register
class FlashInferMLA(Backend):
    name = "flashinfer-mla"
    description = "FlashInfer BatchMLAPagedAttentionWrapper(backend='fa2')"
    package = "flashinfer"
    extra = "flashinfer"
    backend: ClassVar[str] = "fa2"
    capabilities = Capabilities(
        devices=("cuda",), q_dtypes=("float16", "bfloat16"), kv_dtypes=("float8_e4m3fn",), mla=(True,),
        mla_dims=((576, 512),), window_left=False, logits_soft_cap=False, alibi=False, sinks=False,
        empty_requests=False, qo_len_above_kv_len=False,
    )
    compile_fields = ("q_dtype", "kv_dtype")  # the dims: the one ``mla_dims`` pair
    compile_seconds = 60.0  # fa2; fa3 below

    def mla_uri(self, key: CompileKey) -> str:
        """The name FlashInfer gives the module ``key``'s cases load (``get_batch_mla_uri``)."""
        v = dict(key)
        (qk, vo), = self.capabilities.mla_dims or ((576, 512),)
        q, kv = _URI_DTYPE[v["q_dtype"]], _URI_DTYPE[v["kv_dtype"]]
        return (
            f"batch_mla_attention_dtype_q_{q}_dtype_kv_{kv}_dtype_o_{q}_dtype_idx_i32_head_dim_ckv_{vo}_"
            f"head_dim_kpe_{qk - vo}_profiler_False" + ("_sm90" if self.backend == "fa3" else "")
        )

    def _refused(self, key: CompileKey) -> bool:
        v = dict(key)
        return v["kv_dtype"] == "float8_e4m3fn" and v["q_dtype"] != "bfloat16"

    def built_reason(self, key: CompileKey) -> str | None:
        if self._refused(key):
            return "refused: fp8 MLA takes bf16 q only (no case of this key runs, so a campaign draws none)"
        return built_module(self.mla_uri(key))

    def build_variants(self, keys: list[CompileKey]) -> list[CompileKey] | None:
        """The modules of ``keys`` (``build_modules``)."""
        from flashinfer.jit import gen_batch_mla_module

        (qk, vo), = self.capabilities.mla_dims or ((576, 512),)
        specs = []
        for key in keys:
            if self._refused(key):
                continue
            v = dict(key)
            q, kv = getattr(torch, v["q_dtype"]), getattr(torch, v["kv_dtype"])
            specs.append(gen_batch_mla_module(self.backend, q, kv, q, torch.int32, vo, qk - vo, False))
        build_modules(specs)
        return [key for key in keys if self.built_reason(key) is not None]

    def unsupported_reason(self, case: Case) -> str | None:
        reason = super().unsupported_reason(case)
        opts = case.options
        if reason is None and opts.is_fp8 and (opts.q_dtype != "bfloat16" or opts.k_scale != opts.v_scale):
            return "unsupported: FlashInfer MLA fp8 takes bf16 q and one scale for the latent cache"
        return reason

    def plan(self, case: Case) -> tuple[Case, Any]:
        import flashinfer

        device = self.device or "cuda"
        lay, heads = case.layout, case.heads
        index = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
        wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(_workspace(device), backend=self.backend)
        wrapper.plan(
            index(lay.qo_indptr), index(lay.kv_indptr), index(lay.kv_indices), index(lay.kv_lens),
            heads.num_qo_heads, heads.d_ckv, heads.d_kpe, lay.page_size, case.options.causal, case.sm_scale,
            getattr(torch, case.options.q_dtype), getattr(torch, case.options.kv_dtype),
        )
        return case, wrapper

    def run(self, plan: tuple[Case, Any], tensors: Tensors) -> KernelOutput:
        case, wrapper = plan
        d = case.heads.d_ckv
        q_nope, q_pe = tensors.q[..., :d], tensors.q[..., d:]
        ckv, kpe = tensors.k_cache[:, :, 0, :d], tensors.k_cache[:, :, 0, d:]
        scales = {"ckv_scale": case.options.k_scale, "kpe_scale": case.options.k_scale} if case.options.is_fp8 else {}
        out, lse = wrapper.run(q_nope, q_pe, ckv, kpe, return_lse=True, **scales)
        return KernelOutput(out, lse.float() * LN_2)


@register
class FlashInferMLAFA3(FlashInferMLA):
    name = "flashinfer-mla-fa3"
    description = "FlashInfer BatchMLAPagedAttentionWrapper(backend='fa3'), sm90"
    backend = "fa3"
    compile_seconds = 150.0  # an sm90 module: several times fa2's

    def unavailable_reason(self) -> str | None:
        reason = super().unavailable_reason()
        if reason is None and torch.cuda.get_device_capability()[0] != 9:
            return "the fa3 backend needs sm_90 (Hopper)"
        return reason
