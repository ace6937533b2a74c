"""FlashAttention-4 (``flash_attn.cute``, CuTe DSL): ``flash_attn_varlen_func`` on K/V gathered
from the pages (``cu_seqlens_k``; sm90 and sm100+) and on the pages themselves (``page_table`` +
``seqused_k``; sm100+ only: ``_flash_attn_fwd`` asserts "paged KV not supported on SM 9.0").

Conventions (Dao-AILab/flash-attention ``flash_attn/cute/interface.py`` @004b1a2e41bf,
``flash_attn/cute/softmax.py`` @017d473dab39): ``window_size=(left, right)`` with ``None`` for an
open side and ``causal`` forcing ``right = 0``, so ``window_left = w`` is ``(w, None)`` (plus
``causal``); ``softcap`` on the scaled logit; ``learnable_sink`` is a bf16 ``[num_heads]`` logit that
"enlarges the normalizer and the LSE": the output is the oracle's, the LSE is not, so it is not
returned for cases with sinks; LSE ``[num_heads, total_q]``, natural log, ``-inf`` for an empty row.
Head dims 64/96/128 (the module's supported list; 192/128 is Blackwell only), fp16/bf16, no
ALiBi, no fp8, no split-KV on sm90 (``num_splits=1``).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, ClassVar

import torch
from pa_oracle.backends.base import Backend, Capabilities, KernelOutput, Unsupported, register
from pa_oracle.backends.flash_attn import _lse_to_natural_minus_inf
from pa_oracle.backends.flash_attn3 import split_result
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import Tensors, token_addresses

_MODULE = "flash_attn.cute.interface"
_FA4 = Capabilities(
    devices=("cuda",), q_dtypes=("float16", "bfloat16"), head_dims=(64, 96, 128), head_dim_vo_may_differ=False,
    alibi=False, fp8_scales=False,
)


def fa4_window(case: Case) -> tuple[int | None, int | None]:
    """FA4's ``window_size``: ``None`` is an open side; ``causal=True`` closes the right one."""
    left = case.options.window_left if case.options.window_left >= 0 else None
    return (left, 0 if case.options.causal else None)


class _FlashAttn4(Backend):
    family = "flash-attn4"
    # the CuTe DSL compiles a kernel per (dtype, head dim, causal, window, soft cap, sinks, GQA packing) on
    # first use and keeps it in memory only: no key is built before this process compiles it
    compile_fields = ("q_dtype", "head_dim_qk", "causal", "window", "soft_cap", "sinks", "group_size")
    compile_seconds = 30.0
    min_major: ClassVar[int] = 9  # sm90, sm100, sm110
    paged: ClassVar[bool]
    capabilities = _FA4

    def unavailable_reason(self) -> str | None:
        try:
            importlib.import_module(_MODULE)
        except Exception as exc:  # noqa: BLE001 - the CuTe DSL import fails in many ways
            return f"flash_attn.cute (FlashAttention-4) does not import ({type(exc).__name__}: {str(exc)[:80]})"
        if torch.cuda.is_available():
            major = torch.cuda.get_device_capability()[0]
            if major < self.min_major or major > 11:
                return f"{self.name} needs sm{self.min_major}0..sm110; this GPU is sm{major}x"
        return super().unavailable_reason()

    def versions(self) -> dict[str, str]:
        import flash_attn

        return {**super().versions(), "flash_attn": getattr(flash_attn, "__version__", "?")}

    def plan(self, case: Case) -> dict[str, Any]:
        lay, device = case.layout, self.device or "cuda"
        index = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
        plan: dict[str, Any] = {"case": case, "cu_seqlens_q": index(lay.qo_indptr)}
        if self.paged:
            table = lay.block_table(pad=0) if max(lay.num_pages_per_request) else [[0]] * lay.batch_size
            plan.update(seqused_k=index(lay.kv_lens), page_table=index(table))
        else:
            cu_seqlens_k = [0]
            for n in lay.kv_lens:
                cu_seqlens_k.append(cu_seqlens_k[-1] + n)
            pages, slots = (t.to(device) for t in token_addresses(case))
            plan.update(cu_seqlens_k=index(cu_seqlens_k), pages=pages, slots=slots)
        return plan

    def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
        fn = importlib.import_module(_MODULE).flash_attn_varlen_func
        case: Case = plan["case"]
        lay, opts = case.layout, case.options
        if self.paged:
            kv = {"k": tensors.k_cache, "v": tensors.v_cache, "seqused_k": plan["seqused_k"], "page_table": plan["page_table"]}
        else:
            if sum(lay.kv_lens) == 0:
                raise Unsupported("varlen attention needs at least one key token in the batch")
            pages, slots = plan["pages"], plan["slots"]
            kv = {"k": tensors.k_cache[pages, slots], "v": tensors.v_cache[pages, slots], "cu_seqlens_k": plan["cu_seqlens_k"],
                  "max_seqlen_k": max(lay.kv_lens)}
        sink = None if opts.sinks is None else torch.tensor(opts.sinks, dtype=torch.bfloat16, device=tensors.q.device)
        extra = {"return_lse": True} if "return_lse" in inspect.signature(fn).parameters else {}
        result = fn(
            tensors.q, cu_seqlens_q=plan["cu_seqlens_q"], max_seqlen_q=max(lay.qo_lens), softmax_scale=case.sm_scale,
            causal=opts.causal, window_size=fa4_window(case), learnable_sink=sink, softcap=opts.logits_soft_cap,
            num_splits=1, **kv, **extra,
        )
        out, lse = split_result(result)
        if lse is None or opts.sinks is not None:  # FA4's LSE counts the sink; the oracle's does not
            return KernelOutput(out, None)
        return KernelOutput(out, _lse_to_natural_minus_inf(lse).transpose(0, 1))


@register
class FlashAttn4Varlen(_FlashAttn4):
    name = "flash-attn4-varlen"
    description = "FA4 (CuTe DSL) flash_attn_varlen_func on K/V gathered from the pages (cu_seqlens_k)"
    paged = False


@register
class FlashAttn4Paged(_FlashAttn4):
    name = "flash-attn4-paged"
    description = "FA4 (CuTe DSL) flash_attn_varlen_func with page_table + seqused_k (sm100+)"
    paged = True
    min_major = 10
