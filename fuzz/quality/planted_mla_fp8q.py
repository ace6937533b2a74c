"""Planted MLA kernels with an fp8 q (issue 34) for the selftest: q is one fp8 row ``[q_nope | q_pe]`` under one
per-tensor ``q_scale`` (its value ``stored * q_scale``; ``pa_oracle.oracle.case``, as vLLM's
``_decode_concat_quant_fp8_op`` and SGLang's FlashMLA backend quantise it), the latent cache ``[ckv | kpe]`` fp8
with ``k_scale`` (V, its first ``d_ckv`` dims, with ``v_scale``). Each kernel dequantises q itself and attends with
the planted float32 MLA kernel (``planted._paged_attention``: the ``q_nope . ckv`` and ``q_pe . kpe`` dots apart).

``mla_fp8_q_pe_unscaled`` dequantises ``q_nope`` and forgets ``q_pe`` (a split kernel whose rope path reads the
stored codes: its logits' rope part is off by ``1 / q_scale``); ``mla_fp8_q_scale_twice`` dequantises q and folds
``q_scale`` into the logit scale again (``bmm1_scale = q_scale * k_scale * sm_scale``, FlashInfer's trtllm-gen MLA
convention, applied to a q already dequantised). Both are right on every case with a 16-bit q, and on an fp8 q with
``q_scale`` 1: only the MLA fp8-q draw (``families.extend`` keeps the drawn fp8 q) with another scale reaches them.
"""

from __future__ import annotations

from typing import Any

import torch
from pa_oracle.fuzz.quality.planted import _paged_attention
from pa_oracle.oracle.case import FP8_DTYPES

BUGS = {
    "mla_fp8_q_pe_unscaled": "MLA with an fp8 q dequantises q_nope by q_scale and forgets it on q_pe (the rope part's "
                             "logits read the stored codes)",
    "mla_fp8_q_scale_twice": "MLA with an fp8 q dequantises q by q_scale and multiplies the logits by q_scale again "
                             "(folded into bmm1_scale as well)",
}
CORRECT = ("correct_mla_fp8_q",)
PLANTED = tuple(BUGS)
# small latent dims (a fast CPU selftest); e4m3 q only beside bf16, as every upstream MLA fp8-q path quantises q
_CAPABILITIES = {"mla": (True,), "mla_dims": ((12, 8), (24, 16)), "q_dtypes": ("bfloat16", "float8_e4m3fn")}
_FP8 = tuple(getattr(torch, name) for name in FP8_DTYPES)


def _dequantised(q: torch.Tensor, q_scale: float, d_ckv: int, bug: str) -> torch.Tensor:
    """q's values in float32 as the kernel ``bug`` ("" or a ``BUGS`` name) computes them."""
    if q.dtype not in _FP8:
        return q.float()
    nope, pe = q[..., :d_ckv].float(), q[..., d_ckv:].float()
    pe_scale = 1.0 if bug == "mla_fp8_q_pe_unscaled" else q_scale
    return torch.cat([nope * q_scale, pe * pe_scale], dim=-1)


def _mla_fp8_q_kernel(bug: str):  # type: ignore[no-untyped-def]
    """An MLA kernel taking an fp8 q (``bug`` "" or a ``BUGS`` name)."""

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap, k_scale, v_scale, q_scale, out_dtype) -> Any:
        twice = bug == "mla_fp8_q_scale_twice" and q.dtype in _FP8
        out, lse = _paged_attention(
            _dequantised(q, q_scale, v_cache.shape[-1], bug), k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
            kv_indices=kv_indices, kv_last_page_len=kv_last_page_len, causal=causal,
            sm_scale=sm_scale * q_scale if twice else sm_scale, window_left=window_left, logits_soft_cap=logits_soft_cap,
            k_scale=k_scale, v_scale=v_scale, mla=True)
        return out.to(out_dtype), lse

    kernel.__name__ = kernel.__qualname__ = bug or "correct_mla_fp8_q"
    kernel.pa_oracle_capabilities = dict(_CAPABILITIES)  # type: ignore[attr-defined]
    return kernel


mla_fp8_q_pe_unscaled = _mla_fp8_q_kernel("mla_fp8_q_pe_unscaled")
mla_fp8_q_scale_twice = _mla_fp8_q_kernel("mla_fp8_q_scale_twice")
correct_mla_fp8_q = _mla_fp8_q_kernel("")
