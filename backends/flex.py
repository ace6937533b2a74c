"""FlexAttention (``torch.compile(flex_attention)``: inductor C++ on CPU, Triton on CUDA).

The batch is packed into one sequence with document masking: each query row and each key token
carries its request id and position, and a ``mask_mod`` keeps same-request pairs that pass the
bottom-right causal and window tests. ``sm_scale``, soft cap and ALiBi are a ``score_mod``. What
compiles is kept to the shape signature: every option is a tensor the mods read (causal, window,
cap, slopes, scale; flex's own ``scale`` float would be a guard, one compile per value), and lengths
are padded to coarse buckets (queries >= 512, keys >= 2048, then powers of two), so a fuzz run
compiles once per (dtype, head dims, heads).
Compiled flex on CPU returns no LSE (inductor: "return_lse is not supported yet").
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

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


def block_mask_of(mask_mod: Any, lq: int, lk: int, device: torch.device, used: tuple[int, int] | None = None) -> Any:
    """``create_block_mask(mask_mod, 1, 1, lq, lk)``, with the dense mask computed by broadcasting the
    (elementwise) ``mask_mod`` over index grids instead of torch's ``vmap`` (~30x cheaper on CPU), and
    only over the ``used`` (rows, columns) when the mask is False outside them (padding); torch's own
    path if its internals moved."""
    from torch.nn.attention import flex_attention as fa

    try:
        to_blocks, to_sparse = fa._convert_mask_to_block_mask, fa._create_sparse_block_from_block_mask
        block = fa._DEFAULT_SPARSE_BLOCK_SIZE
    except AttributeError:
        return fa.create_block_mask(mask_mod, 1, 1, lq, lk, device=str(device))
    nq, nk = used or (lq, lk)
    rows, cols = torch.arange(nq, device=device)[:, None], torch.arange(nk, device=device)[None, :]
    dense = torch.zeros(1, 1, lq, lk, dtype=torch.bool, device=device)
    dense[0, 0, :nq, :nk] = mask_mod(None, None, rows, cols)
    blocks = to_blocks(dense, Q_BLOCK_SIZE=block, KV_BLOCK_SIZE=block, separate_full_blocks=True)
    return to_sparse(blocks, mask_mod, (lq, lk), block, block)


def _bucket(n: int, smallest: int) -> int:
    """The padded length: ``smallest``, else the next power of two.

    >>> _bucket(3, 512), _bucket(600, 512), _bucket(1800, 2048), _bucket(3000, 2048)
    (512, 1024, 2048, 4096)"""
    return max(smallest, 1 << max(n - 1, 0).bit_length())


@register
class Flex(Backend):
    name = "flex"
    description = "torch FlexAttention, compiled, batch packed with document masking"
    capabilities = Capabilities(sinks=False, fp8_scales=False, returns_lse=False)
    # the shape signature torch.compile specializes on (the padded lengths too, one bucket within fuzz limits)
    compile_fields: ClassVar[tuple[str, ...]] = ("q_dtype", "head_dim_qk", "head_dim_vo", "num_kv_heads", "group_size")
    compile_seconds = 10.0

    def __init__(self) -> None:
        if self.device == "cuda":  # Triton flex: "embedding dimension ... must be at least 16"
            self.capabilities = self.capabilities.replace(
                head_dims=(16, 24, 32, 40, 64, 80, 96, 128, 256), returns_lse=True
            )

    def plan(self, case: Case) -> dict[str, Any]:
        lay, device = case.layout, self.device
        doc_q = torch.repeat_interleave(torch.arange(lay.batch_size), torch.tensor(lay.qo_lens))
        doc_k = torch.repeat_interleave(torch.arange(lay.batch_size), torch.tensor(lay.kv_lens))
        q_pos = torch.cat([torch.arange(k - q, k) for q, k in zip(lay.qo_lens, lay.kv_lens)])
        k_pos = torch.cat([torch.arange(k) for k in lay.kv_lens])
        # one padded shape for every case of the default fuzz limits (<= 384 queries, <= 1800 keys): the
        # padding is whole empty blocks of the block mask, which flex skips
        lq, lk = _bucket(lay.total_q, 512), _bucket(len(doc_k), 2048)
        pad = lambda t, n, fill: torch.cat([t, t.new_full((n - len(t),), fill)]).to(device)  # noqa: E731
        return {
            "case": case,
            "doc_q": pad(doc_q, lq, -1),
            "doc_k": pad(doc_k, lk, -2),
            "q_pos": pad(q_pos, lq, 0),
            "k_pos": pad(k_pos, lk, 0),
        }

    def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
        case: Case = plan["case"]
        opts, device = case.options, tensors.q.device
        doc_q, doc_k, q_pos, k_pos = plan["doc_q"], plan["doc_k"], plan["q_pos"], plan["k_pos"]
        causal = torch.tensor(opts.causal, device=device)
        window = torch.tensor(opts.window_left, device=device)

        def mask_mod(b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            keep = doc_q[qi] == doc_k[kv]
            keep = keep & (~causal | (k_pos[kv] <= q_pos[qi]))
            return keep & ((window < 0) | (k_pos[kv] >= q_pos[qi] - window))

        scale = torch.tensor(case.sm_scale, device=device)
        cap = torch.tensor(opts.logits_soft_cap, device=device)
        slopes = torch.tensor(opts.alibi_slopes or [0.0] * case.heads.num_qo_heads, device=device)

        def score_mod(s: torch.Tensor, b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            s = s * scale
            s = torch.where(cap > 0, cap * torch.tanh(s / cap), s)  # cap 0: s itself
            return s - slopes[h] * (q_pos[qi] - k_pos[kv]).abs()  # no ALiBi: slopes 0, s itself

        lq, lk = len(doc_q), len(doc_k)
        pages, slots = (t.to(device) for t in token_addresses(case))
        q = tensors.q.new_zeros(lq, *tensors.q.shape[1:])
        q[: case.layout.total_q] = tensors.q
        k = tensors.k_cache.new_zeros(lk, *tensors.k_cache.shape[2:])
        v = tensors.v_cache.new_zeros(lk, *tensors.v_cache.shape[2:])
        k[: len(pages)] = tensors.k_cache[pages, slots]
        v[: len(pages)] = tensors.v_cache[pages, slots]
        # padded rows and columns carry request ids -1 and -2: never kept, so the mask is False there
        block_mask = block_mask_of(mask_mod, lq, lk, device, used=(case.layout.total_q, len(pages)))
        want_lse = device.type == "cuda"
        result = _compiled_flex()(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            score_mod=score_mod,
            block_mask=block_mask,
            scale=1.0,
            enable_gqa=True,
            return_lse=want_lse,
        )
        out, lse = result if want_lse else (result, None)
        out = out[0].transpose(0, 1)[: case.layout.total_q]
        if lse is not None:
            lse = lse[0].transpose(0, 1)[: case.layout.total_q].float()
        return KernelOutput(out, lse)
