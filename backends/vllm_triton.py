"""vLLM's unified Triton attention, ``unified_attention`` (``vllm.v1.attention.ops.triton_unified_attention``,
formerly ``vllm.attention.ops.triton_unified_attention``), called as vLLM's ``TritonAttentionImpl.forward``
calls it (vllm-project/vllm ``vllm/v1/attention/backends/triton_attn.py`` @001ceb3e98e7).

Conventions (read from the kernel): always causal, bottom-right (``context_len = seq_len -
query_len``); ``window_size = (sliding_window - 1, 0)`` and the mask ``q_abs - k < 1 + window_size[0]``,
so FlashInfer's ``window_left = w`` is ``(w, 0)``; ``softcap * tanh(S / softcap)`` on the scaled
logit; ALiBi adds ``slope * (k - context_len)``, the oracle's ``-slope * |p - k|`` plus a per-row
constant (same output without sinks; with a sink the constant changes the sink's weight, so
ALiBi + sinks is not declared); a sink starts the running max at ``sink`` with sum 1;
``k_descale``/``v_descale`` are ``layer._k_scale.expand(num_seqs, num_kv_heads)`` and multiply fp8
K/V after loading. The 2-D kernel's decode-only launch indexes sequences by program id, which
assumes no ``qo_len = 0`` request before a decode: vLLM schedules >= 1 query per request, so
``min_qo_len = 1``. Block sizes are multiples of 16 and head sizes >= 32
(``TritonAttentionBackend``). No LSE. vLLM is not a dependency of this package: install it to
run this backend.
"""

from __future__ import annotations

import functools
import importlib
import math
from typing import Any

import torch
from pa_oracle.backends.base import Backend, Capabilities, Contract, KernelOutput, Precondition, register
from pa_oracle.oracle.case import FP8_DTYPES, Case
from pa_oracle.oracle.tensors import Tensors

_MODULES = ("vllm.v1.attention.ops.triton_unified_attention", "vllm.attention.ops.triton_unified_attention")


@functools.cache
def _unified_attention() -> Any:
    errors = []
    for path in _MODULES:
        try:
            return importlib.import_module(path).unified_attention
        except Exception as exc:  # noqa: BLE001 - vllm's import pulls many modules
            errors.append(f"{path}: {type(exc).__name__}: {str(exc)[:80]}")
    raise ImportError("; ".join(errors))


def vllm_window_size(window_left: int) -> tuple[int, int]:
    """``TritonAttentionImpl.sliding_window``: ``(sliding_window - 1, 0)`` or ``(-1, -1)`` when off."""
    return (window_left, 0) if window_left >= 0 else (-1, -1)


@register
class VllmTritonUnified(Backend):
    name = "vllm-triton"
    description = "vLLM unified_attention (Triton, 2-D kernel) with a paged block_table, as TritonAttentionImpl calls it"
    package = "vllm"
    capabilities = Capabilities(
        devices=("cuda",), q_dtypes=("float16", "bfloat16", "float32"), kv_dtypes=FP8_DTYPES,
        head_dims=(32, 40, 48, 64, 80, 96, 112, 128, 160, 192, 256), head_dim_vo_may_differ=False,
        page_size_multiple=16, min_qo_len=1, qo_len_above_kv_len=False, empty_requests=False,
        causal=(True,), returns_lse=False,
    )
    contract = Contract(preconditions=(
        Precondition("min_qo_len", "vLLM schedules at least one query per request (the 2-D decode launch indexes sequences by program id)"),
        Precondition("qo_len_above_kv_len", "vLLM's requests hold their own queries' keys (context_len = seq_len - query_len >= 0)"),
        Precondition("empty_requests", "vLLM schedules no request without keys or queries"),
    ))

    def unavailable_reason(self) -> str | None:
        try:
            importlib.import_module("vllm")
        except ImportError as exc:
            return f"vllm is not installed ({exc}); pip install vllm to run its Triton attention"
        try:
            _unified_attention()
        except ImportError as exc:
            return f"vllm's unified_attention does not import ({exc})"
        return super().unavailable_reason()

    def unsupported_reason(self, case: Case) -> str | None:
        reason = super().unsupported_reason(case)
        if reason is None and case.options.alibi_slopes is not None and case.options.sinks is not None:
            return "unsupported: ALiBi + sinks (vLLM's ALiBi is offset by the query's index, which moves the sink's weight)"
        return reason

    def plan(self, case: Case) -> dict[str, Any]:
        lay, opts, device = case.layout, case.options, self.device or "cuda"
        index = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
        descale = (lay.batch_size, case.heads.num_kv_heads)
        return {
            "case": case,
            "cu_seqlens_q": index(lay.qo_indptr),
            "seqused_k": index(lay.kv_lens),
            "block_table": index(lay.block_table(pad=0)),
            "k_descale": torch.tensor(opts.k_scale, dtype=torch.float32, device=device).expand(descale),
            "v_descale": torch.tensor(opts.v_scale, dtype=torch.float32, device=device).expand(descale),
        }

    def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
        case: Case = plan["case"]
        lay, opts, device = case.layout, case.options, tensors.q.device
        out = torch.full_like(tensors.q, math.nan)
        as_f32 = lambda xs: None if xs is None else torch.tensor(xs, dtype=torch.float32, device=device)  # noqa: E731
        _unified_attention()(
            q=tensors.q, k=tensors.k_cache, v=tensors.v_cache, out=out, cu_seqlens_q=plan["cu_seqlens_q"],
            max_seqlen_q=max(lay.qo_lens), seqused_k=plan["seqused_k"], max_seqlen_k=max(lay.kv_lens),
            softmax_scale=case.sm_scale, causal=True, window_size=vllm_window_size(opts.window_left),
            block_table=plan["block_table"], softcap=opts.logits_soft_cap, q_descale=None,
            k_descale=plan["k_descale"], v_descale=plan["v_descale"],
            alibi_slopes=as_f32(opts.alibi_slopes), sinks=as_f32(opts.sinks),
        )
        return KernelOutput(out, None)
