"""FlashInfer's POD attention (``BatchPODWithPagedKVCacheWrapper``, 0.6.18.post1): a batch's prefill
and decode requests in one fused launch over the same paged cache.

The case's requests with ``qo_len == 1`` form the decode batch, every other request the prefill
batch (both keep their own pages of the one pool); the two outputs are put back in the case's row
order, so the oracle judges the whole batch as one call. A case without both kinds is skipped.
What ``flashinfer/pod.py`` says, and so what is declared: no soft cap ("Logits soft cap is not
supported currently": plan() forces 0), one ``pos_encoding_mode`` and ``window_left`` for both
sides, q/k/v fp8 scales "applied to the decode side" only (so no fp8 KV here), the decode side runs
non-causal (a one-query row sees every key either way), ``causal_p`` for the prefill side. The
fused module is JIT-built on first use (``batch_pod_with_kv_cache_...``); the plan also loads the
fa2 prefill module of the same dtypes. Its parts (``parts``, the ``composed-vs-parts`` check): the paged fa2
prefill on the prefill requests and the tensor-core decode (the same fa2 prefill module: ``pod.py``
plans its decode side with ``use_tensor_cores``) on the decode requests.
"""

from __future__ import annotations

from typing import Any

import torch
from pa_oracle.backends.base import CompileKey, KernelOutput, Part, Unsupported, register
from pa_oracle.backends.flashinfer import _FLASHINFER, _URI_DTYPE, _FlashInferBackend, _workspace, built_module, module_uri
from pa_oracle.oracle.case import Case, Layout
from pa_oracle.oracle.tensors import Tensors


def pod_uri(key: CompileKey) -> str:
    """The fused module FlashInfer builds for a key (``jit/attention/modules.py`` get_pod_uri, "batch_" prefix)."""
    v = dict(key)
    q, kv, dim, window = _URI_DTYPE[v["q_dtype"]], _URI_DTYPE[v["kv_dtype"]], v["head_dim_qk"], bool(v["window"])
    return (
        f"batch_pod_with_kv_cache_dtype_q_{q}_dtype_kv_{kv}_dtype_o_{q}_head_dim_{dim}_posenc_p_0_use_swa_p_{window}_"
        f"use_logits_cap_p_False_posenc_d_0_use_swa_d_{window}_use_logits_cap_d_False_dtype_idx_i32_f16qk_False"
    )


def split_requests(layout: Layout) -> tuple[list[int], list[int]]:
    """(prefill requests, decode requests): decode are those with exactly one query."""
    decode = [b for b, n in enumerate(layout.qo_lens) if n == 1]
    return [b for b in range(layout.batch_size) if b not in decode], decode


def sub_layout(layout: Layout, requests: list[int]) -> dict[str, list[int]]:
    """``requests``' CSR layout (``Layout.subset``: their own page ids in the same pool), as lists."""
    sub = layout.subset(requests)
    return {name: list(getattr(sub, name)) for name in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len")}


def rows_of(layout: Layout, requests: list[int]) -> list[int]:
    return layout.rows_of(requests)


@register
class FlashInferPod(_FlashInferBackend):
    name = "flashinfer-pod"
    description = "FlashInfer BatchPODWithPagedKVCacheWrapper: the qo_len-1 requests as its decode batch, the rest as its prefill batch"
    family = "flashinfer-pod"
    capabilities = _FLASHINFER.replace(logits_soft_cap=False, alibi=False, kv_dtypes=None, fp8_scales=False, mixed_batch=True)
    compile_fields = ("q_dtype", "kv_dtype", "head_dim_qk", "window")
    compile_seconds = 120.0
    parts = (Part("prefill", "flashinfer-prefill-fa2"), Part("decode", "flashinfer-decode-tc"))

    def modules(self, key: CompileKey) -> list[str]:
        prefill_key = (*key, ("alibi", False), ("soft_cap", False))
        return [pod_uri(key), module_uri("prefill", prefill_key, "fa2")]

    def built_reason(self, key: CompileKey) -> str | None:
        reasons = [built_module(uri) for uri in self.modules(key)]
        return None if None in reasons else ("prebuilt" if set(reasons) == {"prebuilt"} else "cached")

    def build_variants(self, keys: list[CompileKey]) -> list[CompileKey] | None:
        return None  # no JitSpec helper here: warm-up compiles by judging one case per key

    def call_source(self, case: Case) -> str | None:
        return None  # the split and the reassembly are this adapter's: no standalone repro

    def plan(self, case: Case) -> tuple[Case, Any, torch.Tensor, torch.Tensor]:
        import flashinfer

        lay, heads, opts = case.layout, case.heads, case.options
        prefill, decode = split_requests(lay)
        if not prefill or not decode:
            raise Unsupported("POD needs a decode request (qo_len 1) and a prefill request (any other qo_len) in one batch")
        device = self.device or "cuda"
        parts = [{k: self._index(v, device) for k, v in sub_layout(lay, requests).items()} for requests in (prefill, decode)]
        wrapper = flashinfer.BatchPODWithPagedKVCacheWrapper(_workspace(device), self.kv_layout)
        wrapper.plan(
            *(parts[0][k] for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len")),
            *(parts[1][k] for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len")),
            heads.num_qo_heads, heads.num_kv_heads, heads.head_dim_qk, lay.page_size,
            pos_encoding_mode="NONE", window_left=opts.window_left, q_data_type=getattr(torch, opts.q_dtype),
            kv_data_type=getattr(torch, opts.kv_dtype), sm_scale=case.sm_scale,
        )
        rows = [torch.tensor(rows_of(lay, requests), dtype=torch.long, device=device) for requests in (prefill, decode)]
        return case, wrapper, rows[0], rows[1]

    def run(self, plan: tuple[Case, Any, torch.Tensor, torch.Tensor], tensors: Tensors) -> KernelOutput:
        case, wrapper, rows_p, rows_d = plan
        caches = self._paged_kv(tensors)
        (out_p, out_d), (lse_p, lse_d) = wrapper.run(
            tensors.q[rows_p], caches, tensors.q[rows_d], caches, causal_p=case.options.causal, return_lse=True
        )
        out = out_p.new_empty(case.layout.total_q, *out_p.shape[1:])
        lse = lse_p.new_empty(case.layout.total_q, lse_p.shape[1])
        out[rows_p], out[rows_d] = out_p, out_d
        lse[rows_p], lse[rows_d] = lse_p, lse_d
        return self._finish(case, out, lse)
