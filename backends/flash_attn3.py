"""FlashAttention-3 (``flash_attn_interface``, built from flash-attention's ``hopper/``): the
paged varlen path ``flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=, page_table=,
cu_seqlens_q=, max_seqlen_q=)`` (any page size), with FA3's split heuristic (``num_splits=0``),
four forced splits, and vLLM's ahead-of-time schedule (``scheduler_metadata`` from
``get_scheduler_metadata``); and ``flash_attn_varlen_func`` on K/V gathered from the pages
(upstream FA3's varlen function takes no page table).

Conventions (Dao-AILab/flash-attention ``hopper/flash_attn_interface.py`` @01afd16d248c):
flash-attn's ``window_size=(left, right)``, bottom-right aligned, so ``window_left = w`` is
``(w, 0)`` causal or ``(w, -1)`` not; ``softcap`` on the scaled logit; with ``cu_seqlens_q`` the
LSE is ``[num_heads, total_q]``, natural log; a row with no key is 0 with LSE +-inf (+inf is
mapped to -inf, as for flash-attn 2). Head dims up to 256 in multiples of 8 (16-byte alignment),
one head dim for Q/K and V (other pairs are built only for a few shapes), no ALiBi, no sinks, fp8
only with fp8 Q as well (the oracle's fp8 cases keep a 16-bit Q).
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

import torch
from pa_oracle.backends.base import Backend, Capabilities, Contract, KernelOutput, Unsupported, register
from pa_oracle.backends.flash_attn import _lse_to_natural_minus_inf, _window
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import Tensors, token_addresses

_FA3 = Capabilities(
    devices=("cuda",), q_dtypes=("float16", "bfloat16"), head_dims=tuple(range(8, 257, 8)),
    head_dim_vo_may_differ=False, alibi=False, sinks=False, fp8_scales=False,
)


def split_result(result: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, lse) from a flash-attn call that returns ``out`` or ``(out, lse, *rest)``."""
    if isinstance(result, (tuple, list)):
        return result[0], result[1] if len(result) > 1 else None
    return result, None


class _FlashAttn3(Backend):
    package = "flash_attn_interface"
    contract = Contract(empty_row_lse="+inf")
    family = "flash-attn3"
    compile_fields = ()  # built ahead from hopper/ (AOT): nothing compiles per case

    def unavailable_reason(self) -> str | None:
        try:
            importlib.import_module(self.package or "")
        except Exception as exc:  # noqa: BLE001 - a missing .so or CUDA mismatch raises more than ImportError
            return (
                f"FlashAttention-3 (flash_attn_interface, built from flash-attention's hopper/) does not import "
                f"({type(exc).__name__}: {str(exc)[:80]}); flash-attn 2's wheel does not include it"
            )
        if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 8:
            return "FlashAttention-3 needs sm80+ (its main target is sm90)"
        return super().unavailable_reason()

    @staticmethod
    def _index(xs: Any, device: str) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.int32, device=device)

    def _finish(self, out: torch.Tensor, lse: torch.Tensor | None) -> KernelOutput:
        return KernelOutput(out, None if lse is None else _lse_to_natural_minus_inf(lse).transpose(0, 1))


class _Paged(_FlashAttn3):
    """``flash_attn_with_kvcache`` with a page table and variable-length queries."""

    capabilities = _FA3
    num_splits: ClassVar[int] = 0  # FA3's heuristic
    ahead_of_time: ClassVar[bool] = False  # vLLM's scheduler_metadata

    def plan(self, case: Case) -> dict[str, Any]:
        lay, device = case.layout, self.device or "cuda"
        table = lay.block_table(pad=0) if max(lay.num_pages_per_request) else [[0]] * lay.batch_size
        plan = {
            "case": case, "cu_seqlens_q": self._index(lay.qo_indptr, device),
            "cache_seqlens": self._index(lay.kv_lens, device), "page_table": self._index(table, device),
            "scheduler_metadata": None,
        }
        if self.ahead_of_time:
            fa3 = importlib.import_module("flash_attn_interface")
            heads, opts = case.heads, case.options
            plan["scheduler_metadata"] = fa3.get_scheduler_metadata(
                lay.batch_size, max(lay.qo_lens), max(lay.kv_lens), heads.num_qo_heads, heads.num_kv_heads,
                heads.head_dim_qk, plan["cache_seqlens"], qkv_dtype=getattr(torch, opts.q_dtype),
                headdim_v=heads.head_dim_vo, cu_seqlens_q=plan["cu_seqlens_q"], page_size=lay.page_size,
                causal=opts.causal, window_size=_window(case), has_softcap=opts.logits_soft_cap > 0,
                num_splits=self.num_splits,
            )
        return plan

    def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
        fa3 = importlib.import_module("flash_attn_interface")
        case: Case = plan["case"]
        opts = case.options
        result = fa3.flash_attn_with_kvcache(
            tensors.q, tensors.k_cache, tensors.v_cache, cache_seqlens=plan["cache_seqlens"],
            page_table=plan["page_table"], cu_seqlens_q=plan["cu_seqlens_q"], max_seqlen_q=max(case.layout.qo_lens),
            softmax_scale=case.sm_scale, causal=opts.causal, window_size=_window(case), softcap=opts.logits_soft_cap,
            scheduler_metadata=plan["scheduler_metadata"], num_splits=self.num_splits, return_softmax_lse=True,
        )
        return self._finish(*split_result(result))


@register
class FlashAttn3Paged(_Paged):
    name = "flash-attn3-paged"
    description = "FA3 flash_attn_with_kvcache: page_table + cu_seqlens_q (varlen queries), split heuristic"


@register
class FlashAttn3PagedSplit4(_Paged):
    name = "flash-attn3-paged-split4"
    description = "FA3 flash_attn_with_kvcache, page_table + cu_seqlens_q, num_splits=4 (split-KV + combine)"
    num_splits = 4


@register
class FlashAttn3PagedAot(_Paged):
    name = "flash-attn3-paged-aot"
    description = "FA3 flash_attn_with_kvcache with scheduler_metadata from get_scheduler_metadata (vLLM's AOT schedule)"
    ahead_of_time = True


@register
class FlashAttn3Varlen(_FlashAttn3):
    name = "flash-attn3-varlen"
    description = "FA3 flash_attn_varlen_func on K/V gathered from the pages (cu_seqlens_k)"
    capabilities = _FA3

    def plan(self, case: Case) -> dict[str, Any]:
        lay, device = case.layout, self.device or "cuda"
        cu_seqlens_k = [0]
        for n in lay.kv_lens:
            cu_seqlens_k.append(cu_seqlens_k[-1] + n)
        pages, slots = (t.to(device) for t in token_addresses(case))
        return {
            "case": case, "cu_seqlens_q": self._index(lay.qo_indptr, device),
            "cu_seqlens_k": self._index(cu_seqlens_k, device), "pages": pages, "slots": slots,
        }

    def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
        fa3 = importlib.import_module("flash_attn_interface")
        case: Case = plan["case"]
        lay, opts = case.layout, case.options
        if sum(lay.kv_lens) == 0:
            raise Unsupported("varlen attention needs at least one key token in the batch")
        keys, values = tensors.k_cache[plan["pages"], plan["slots"]], tensors.v_cache[plan["pages"], plan["slots"]]
        result = fa3.flash_attn_varlen_func(
            tensors.q, keys, values, plan["cu_seqlens_q"], plan["cu_seqlens_k"], max(lay.qo_lens), max(lay.kv_lens),
            softmax_scale=case.sm_scale, causal=opts.causal, window_size=_window(case), softcap=opts.logits_soft_cap,
            return_attn_probs=True,
        )
        return self._finish(*split_result(result))
