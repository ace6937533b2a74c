"""FlexAttention (``torch.compile(flex_attention)``: inductor C++ on CPU, Triton on CUDA).

The batch is packed into one sequence with document masking: each query row and each key token
carries its request id and position, and a ``mask_mod`` keeps same-request pairs that pass the
bottom-right causal and window tests. Soft cap and ALiBi are a ``score_mod``. Lengths are padded
to power-of-two buckets (>= 128) so that a fuzz run reuses compiled kernels.
Compiled flex on CPU returns no LSE (inductor: "return_lse is not supported yet").
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from pa_oracle.backends.base import Backend, Capabilities, KernelOutput, register
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import Tensors, token_addresses


@functools.cache
def _compiled_flex() -> Any:
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    # every new (shape, dtype, mask) signature recompiles; don't fall back to eager after 8
    torch._dynamo.config.recompile_limit = 10_000
    torch._dynamo.config.accumulated_recompile_limit = 100_000
    return torch.compile(flex_attention, dynamic=False)


def _bucket(n: int) -> int:
    return max(128, 1 << max(n - 1, 0).bit_length())


@register
class Flex(Backend):
    name = "flex"
    description = "torch FlexAttention, compiled, batch packed with document masking"
    capabilities = Capabilities(sinks=False, fp8_scales=False, returns_lse=False)

    def __init__(self) -> None:
        if self.device == "cuda":  # Triton flex: "embedding dimension ... must be at least 16"
            self.capabilities = self.capabilities.replace(  # type: ignore[misc]
                head_dims=(16, 24, 32, 40, 64, 80, 96, 128, 256), returns_lse=True
            )

    def plan(self, case: Case) -> dict[str, Any]:
        lay, device = case.layout, self.device
        doc_q = torch.repeat_interleave(torch.arange(lay.batch_size), torch.tensor(lay.qo_lens))
        doc_k = torch.repeat_interleave(torch.arange(lay.batch_size), torch.tensor(lay.kv_lens))
        q_pos = torch.cat([torch.arange(k - q, k) for q, k in zip(lay.qo_lens, lay.kv_lens)])
        k_pos = torch.cat([torch.arange(k) for k in lay.kv_lens])
        lq, lk = _bucket(lay.total_q), _bucket(len(doc_k))
        pad = lambda t, n, fill: torch.cat([t, t.new_full((n - len(t),), fill)]).to(device)  # noqa: E731
        return {
            "case": case,
            "doc_q": pad(doc_q, lq, -1),
            "doc_k": pad(doc_k, lk, -2),
            "q_pos": pad(q_pos, lq, 0),
            "k_pos": pad(k_pos, lk, 0),
        }

    def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
        from torch.nn.attention.flex_attention import create_block_mask

        case: Case = plan["case"]
        opts, device = case.options, tensors.q.device
        doc_q, doc_k, q_pos, k_pos = plan["doc_q"], plan["doc_k"], plan["q_pos"], plan["k_pos"]
        causal, window = opts.causal, opts.window_left

        def mask_mod(b, h, qi, kv):  # type: ignore[no-untyped-def]
            keep = doc_q[qi] == doc_k[kv]
            if causal:
                keep = keep & (k_pos[kv] <= q_pos[qi])
            if window >= 0:
                keep = keep & (k_pos[kv] >= q_pos[qi] - window)
            return keep

        score_mod = None
        cap = torch.tensor(opts.logits_soft_cap, device=device)
        slopes = torch.tensor(opts.alibi_slopes or [0.0], device=device)
        if opts.logits_soft_cap > 0 or opts.alibi_slopes is not None:
            use_cap, use_alibi = opts.logits_soft_cap > 0, opts.alibi_slopes is not None

            def score_mod(s, b, h, qi, kv):  # type: ignore[no-untyped-def]
                if use_cap:
                    s = cap * torch.tanh(s / cap)
                if use_alibi:
                    s = s - slopes[h] * (q_pos[qi] - k_pos[kv]).abs()
                return s

        lq, lk = len(doc_q), len(doc_k)
        pages, slots = (t.to(device) for t in token_addresses(case))
        q = tensors.q.new_zeros(lq, *tensors.q.shape[1:])
        q[: case.layout.total_q] = tensors.q
        k = tensors.k_cache.new_zeros(lk, *tensors.k_cache.shape[2:])
        v = tensors.v_cache.new_zeros(lk, *tensors.v_cache.shape[2:])
        k[: len(pages)] = tensors.k_cache[pages, slots]
        v[: len(pages)] = tensors.v_cache[pages, slots]
        block_mask = create_block_mask(mask_mod, 1, 1, lq, lk, device=str(device))
        want_lse = device.type == "cuda"
        result = _compiled_flex()(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            score_mod=score_mod,
            block_mask=block_mask,
            scale=case.sm_scale,
            enable_gqa=True,
            return_lse=want_lse,
        )
        out, lse = result if want_lse else (result, None)
        out = out[0].transpose(0, 1)[: case.layout.total_q]
        if lse is not None:
            lse = lse[0].transpose(0, 1)[: case.layout.total_q].float()
        return KernelOutput(out, lse)
