"""SGLang's Triton decode kernel (``decode_attention_fwd``): token-level ``kv_indptr`` /
``kv_indices`` into a flat K/V buffer, split-KV in two stages with ``num_kv_splits`` per request.

The canonical pages are handed over as a flat buffer (``k_cache.view(num_pages * page_size, ...)``,
a view) and each request's tokens as ``page * page_size + slot``: the kernel sees the same bytes,
poison included. Two backends: one split (``sglang-decode``) and eight splits forced
(``sglang-decode-split8``, the split/merge path). No LSE is returned.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pa_oracle.backends.base import Backend, Capabilities, CompileKey, Contract, KernelOutput, Precondition, register
from pa_oracle.oracle.case import FP8_DTYPES, Case
from pa_oracle.oracle.tensors import Tensors, token_addresses

_SGLANG = Capabilities(
    devices=("cuda",), q_dtypes=("float16", "bfloat16"), kv_dtypes=FP8_DTYPES, min_qo_len=1, max_qo_len=1,
    causal=(False, True), window_left=False, alibi=False, custom_sm_scale=True, returns_lse=False,
    empty_requests=False, storages=("contiguous", "fused_qkv", "pool_offset"),
)
# storages: the pools are read as one flat token buffer (``view(-1, H, D)``, a uniform token stride), so
# combined K/V and HND pages cannot be handed over; q is read through its row and head strides
# a kv_len 0 request gives NaN (stage 2 divides by an empty sum), which SGLang never passes: its
# CUDA-graph padding rows get seq_len 1 (TritonAttnBackend.get_cuda_graph_seq_len_fill_value). vLLM's
# copy of this kernel pads with 0, so there it is a bug (vllm#57017, fix vllm#57094).
_SGLANG_CONTRACT = Contract(preconditions=(
    Precondition("empty_requests", "SGLang never runs a kv_len 0 request: CUDA-graph padding rows get seq_len 1 "
                 "(get_cuda_graph_seq_len_fill_value)"),
))


_TOO_NARROW = "a head dim < 16 with GQA (the grouped decode kernel's tl.dot needs dims >= 16)"


def _grouped_dot_too_narrow(group_size: int, head_dim_qk: int, head_dim_vo: int) -> bool:
    """The grouped stage 1 (``_fwd_grouped_kernel_stage1``) computes tl.dot over BLOCK_DMODEL / BLOCK_DV, which
    Triton refuses below 16 (a CompilationError on the H200, 2026-12-02); the group-1 kernel uses tl.sum."""
    return group_size > 1 and min(head_dim_qk, head_dim_vo) < 16


class _SglangDecode(Backend):
    num_kv_splits: ClassVar[int]
    capabilities = _SGLANG
    contract = _SGLANG_CONTRACT
    family = "sglang-triton-decode"
    # Triton compiles both stages per dtype and constexpr (0.5.10.post1: kv_group_num, q_head_num, Lk, Lv, the value of
    # logit_cap; stage 2 HAS_SINK); the int arguments' ==1 / %16 specializations may add a few more per key
    compile_fields: ClassVar[tuple[str, ...]] = (
        "q_dtype", "kv_dtype", "head_dim_qk", "head_dim_vo", "num_kv_heads", "group_size", "logits_soft_cap", "sinks")
    compile_seconds = 4.0

    def unavailable_reason(self) -> str | None:
        try:
            from sglang.srt.layers.attention.triton_ops.decode_attention import decode_attention_fwd  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - sglang's import pulls many modules
            return f"sglang's Triton decode kernel does not import ({type(exc).__name__}: {str(exc)[:80]})"
        return super().unavailable_reason()

    def built_reason(self, key: CompileKey) -> str | None:
        v = dict(key)
        if _grouped_dot_too_narrow(v.get("group_size", 1), v.get("head_dim_qk", 16), v.get("head_dim_vo", 16)):
            return f"refused: {_TOO_NARROW} (every case of the key)"
        return None  # Triton's own cache is not read: a key's first case is counted as compiling

    def unsupported_reason(self, case: Case) -> str | None:
        reason = super().unsupported_reason(case)
        heads = case.heads
        if reason is None and _grouped_dot_too_narrow(heads.group_size, heads.head_dim_qk, heads.head_dim_vo):
            return f"unsupported: {_TOO_NARROW}"
        return reason

    def versions(self) -> dict[str, str]:
        import sglang
        import triton  # type: ignore[import-untyped]  # triton ships no type information (no py.typed, no stubs)

        return {**super().versions(), "sglang": getattr(sglang, "__version__", "?"), "triton": triton.__version__}

    def plan(self, case: Case) -> dict[str, Any]:
        lay, device = case.layout, self.device or "cuda"
        pages, slots = token_addresses(case)
        indptr = [0]
        for n in lay.kv_lens:
            indptr.append(indptr[-1] + n)
        return {
            "case": case,
            "kv_indptr": torch.tensor(indptr, dtype=torch.int32, device=device),
            "kv_indices": (pages * lay.page_size + slots).to(torch.int64).to(device),
            "num_kv_splits": torch.full((lay.batch_size,), self.num_kv_splits, dtype=torch.int32, device=device),
        }

    def call_source(self, case: Case) -> str | None:
        return f"""\
from sglang.srt.layers.attention.triton_ops.decode_attention import decode_attention_fwd

NUM_KV_SPLITS = {self.num_kv_splits}
token_indptr = [0]
for n in kv_lens:
    token_indptr.append(token_indptr[-1] + n)
out = q.new_empty(B, num_qo_heads, head_dim_vo)
attn_logits = torch.empty(B, num_qo_heads, NUM_KV_SPLITS, head_dim_vo, dtype=torch.float32, device=device)
attn_lse = torch.empty(B, num_qo_heads, NUM_KV_SPLITS, dtype=torch.float32, device=device)
decode_attention_fwd(
    q, k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:]), out,
    index(token_indptr), torch.tensor(token_slots, dtype=torch.int64, device=device),
    attn_logits, attn_lse, torch.full((B,), NUM_KV_SPLITS, dtype=torch.int32, device=device), NUM_KV_SPLITS,
    sm_scale, k_scale, v_scale, logit_cap=logits_soft_cap,
    sinks=None if sinks is None else torch.tensor(sinks, dtype=torch.float32, device=device),
)
lse = None  # this kernel returns no LSE
"""

    def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
        from sglang.srt.layers.attention.triton_ops.decode_attention import decode_attention_fwd

        case: Case = plan["case"]
        heads, opts = case.heads, case.options
        batch = case.layout.batch_size
        flat = lambda cache: cache.view(-1, *cache.shape[2:])  # noqa: E731
        out = tensors.q.new_empty(batch, heads.num_qo_heads, heads.head_dim_vo)
        logits = torch.empty(batch, heads.num_qo_heads, self.num_kv_splits, heads.head_dim_vo, dtype=torch.float32, device=out.device)
        lse = torch.empty(batch, heads.num_qo_heads, self.num_kv_splits, dtype=torch.float32, device=out.device)
        sinks = None if opts.sinks is None else torch.tensor(opts.sinks, dtype=torch.float32, device=out.device)
        decode_attention_fwd(
            tensors.q, flat(tensors.k_cache), flat(tensors.v_cache), out, plan["kv_indptr"], plan["kv_indices"],
            logits, lse, plan["num_kv_splits"], self.num_kv_splits, case.sm_scale, opts.k_scale, opts.v_scale,
            logit_cap=opts.logits_soft_cap, sinks=sinks,
        )
        return KernelOutput(out, None)


@register
class SglangDecode(_SglangDecode):
    name = "sglang-decode"
    description = "SGLang Triton decode_attention_fwd, one KV split"
    num_kv_splits = 1


@register
class SglangDecodeSplit8(_SglangDecode):
    name = "sglang-decode-split8"
    description = "SGLang Triton decode_attention_fwd, eight KV splits (two-stage merge)"
    num_kv_splits = 8
