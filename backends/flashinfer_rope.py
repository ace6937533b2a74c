"""FlashInfer's in-kernel RoPE: the paged decode and fa2 prefill wrappers planned with
``pos_encoding_mode="ROPE_LLAMA"``, ``rope_scale`` and ``rope_theta`` (FlashInfer 0.6.18.post1).

What FlashInfer's source says (``include/flashinfer/pos_enc.cuh``, ``attention/decode.cuh``,
``attention/prefill.cuh``), and so what these adapters declare:

* Pairing: ``vec_apply_llama_rope`` and ``{q,k}_frag_apply_llama_rope`` rotate dim ``d`` with
  ``d +- head_dim / 2`` (halves: the oracle's ``"neox"`` style); the interleaved appliers serve only
  the standalone ``flashinfer.rope`` ops. The whole head rotates (no ``rotary_dim`` in attention).
* Frequencies: ``rope_rcp_scale * rope_rcp_theta ** (2 * (d % (head_dim / 2)) / head_dim)``, i.e. the
  angle ``(p / rope_scale) * theta ** (-2 i / head_dim)``: ``rope_scale`` divides positions (linear
  interpolation). No Llama-3.1 frequency scaling in attention (only ``flashinfer.apply_llama31_rope``).
* Positions: decode rotates q at ``kv_len - 1`` and key ``j`` at ``j`` (no ``rope_pos_offset`` given);
  prefill rotates q at ``(q_packed_idx + (kv_len - qo_len) * group) / group`` = ``kv_len - qo_len + i``,
  computed in uint32, so a query before the first key (qo_len > kv_len) wraps: a precondition.
* No explicit positions (``Case.positions``, EAGLE's ``prefix + depth`` of a draft tree): the kernels' params
  hold ``maybe_q_rope_offset`` (per query) and ``paged_kv.rope_pos_offset`` (one offset per request, keys at
  ``offset + j``), but the wrappers' JIT modules never set them (``gen_batch_prefill_module``'s
  ``additional_tensor_names``; ``plan``/``run`` take no positions), and a per-request offset could not place a
  tree's keys at their depths anyway. So ``rope_positions`` stays off: such a case is unsupported, by name.
* fp8 KV: the prefill rotation asserts a 16-bit K (``k_smem_inplace_apply_rotary``'s
  ``static_assert(sizeof(DTypeKV) == 2)``); CUDA-core decode loads fp8 K through ``cast_load``.
* ALiBi is the other ``pos_encoding_mode``: never both. fa3 takes no RoPE (``is_fa3_backend_supported``).

There is no upstream repro (``call_source``): the standalone repro's own reference has no RoPE.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pa_oracle.backends.base import Capabilities, Precondition, register
from pa_oracle.backends.flashinfer import (
    _COMPILE_FIELDS,
    _FLASHINFER_CONTRACT,
    FlashInferDecode,
    FlashInferDecodeTensorCores,
    FlashInferPrefillFA2,
    _FlashInferBackend,
)
from pa_oracle.oracle.case import Case

_ROPE = {"rope": (True,), "rope_styles": ("neox",), "rope_partial": False, "alibi": False}
_PREFILL_CONTRACT = dataclasses.replace(_FLASHINFER_CONTRACT, preconditions=(
    Precondition("qo_len_above_kv_len", "prefill.cuh q_smem_inplace_apply_rotary computes a query's rope position "
                 "q_packed_idx + (kv_len - qo_len) * group in uint32: a query before the first key wraps"),
))


class _Rope(_FlashInferBackend):
    """Plans the wrapper with FlashInfer's RoPE (mixed in before a FlashInfer paged adapter, whose
    ``_common_plan_kwargs`` it extends)."""

    compile_fields = (*_COMPILE_FIELDS, "rope")  # a module per pos_encoding_mode (posenc_1 in its name)

    def _common_plan_kwargs(self, case: Case) -> dict[str, Any]:
        rope = case.options.rope
        kwargs = super()._common_plan_kwargs(case)
        if rope is not None:
            kwargs.update(pos_encoding_mode="ROPE_LLAMA", rope_scale=float(rope.scale), rope_theta=float(rope.theta))
        return kwargs

    def call_source(self, case: Case) -> str | None:
        return None


def _with_rope(caps: Capabilities, **changes: Any) -> Capabilities:
    return caps.replace(**_ROPE, **changes)


@register
class FlashInferDecodeRope(_Rope, FlashInferDecode):
    name = "flashinfer-decode-rope"
    description = "FlashInfer BatchDecodeWithPagedKVCacheWrapper, CUDA-core path, pos_encoding_mode='ROPE_LLAMA'"
    capabilities = _with_rope(FlashInferDecode.capabilities)


@register
class FlashInferDecodeTensorCoresRope(_Rope, FlashInferDecodeTensorCores):
    name = "flashinfer-decode-tc-rope"
    description = "FlashInfer BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True), pos_encoding_mode='ROPE_LLAMA'"
    # the prefill kernel underneath rotates K in place as 16-bit values
    capabilities = _with_rope(FlashInferDecodeTensorCores.capabilities, kv_dtypes=None, fp8_scales=False)


@register
class FlashInferPrefillFA2Rope(_Rope, FlashInferPrefillFA2):
    name = "flashinfer-prefill-fa2-rope"
    description = "FlashInfer BatchPrefillWithPagedKVCacheWrapper(backend='fa2'), pos_encoding_mode='ROPE_LLAMA'"
    contract = _PREFILL_CONTRACT
    capabilities = _with_rope(FlashInferPrefillFA2.capabilities, kv_dtypes=None, fp8_scales=False, qo_len_above_kv_len=False)
