"""FlexAttention on the attention families: draft-tree / custom masks, attention sinks, MLA.

The batch is packed with document masking as in ``flex``. A custom mask is read inside
``mask_mod`` the way paged kernels read FlashInfer's mask: one flat boolean array, request ``b``'s
``[qo_len, kv_len]`` block at its own offset, indexed by (local query, key position). Sinks are
one extra key per request (zero K and V) whose score ``score_mod`` replaces by ``sinks[h]``, and
which every query of the request sees: it adds ``exp(sink)`` to the denominator only. Flex's
LSE then includes the sink, so sink cases return no LSE (neither does compiled flex on CPU).
MLA runs as MQA over the latent cache with V its first ``d_ckv`` dims (flex takes Dv != Dqk).
As in ``flex``, every option (causal, window, mask, cap, ALiBi, sinks, scale) is a tensor the mods read,
so a campaign compiles once per shape signature (dtype, head dims, heads), not once per option value.
A case of no family (no mask, MLA or sinks) runs too: the same mods, with an all-True mask and no sink key.
Runs on CPU (inductor C++) too: this is the families' CPU-testable real kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pa_oracle.backends.base import Capabilities, KernelOutput, register
from pa_oracle.backends.flex import Flex, _bucket, _compiled_flex, block_mask_of
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import Tensors, token_addresses


@register
class FlexFamilies(Flex):
    name = "flex-families"
    description = "torch FlexAttention, compiled: tree/custom masks in mask_mod, sinks as a score_mod key, MLA"
    capabilities = Capabilities(
        fp8_scales=False, returns_lse=False, sinks=True, custom_mask=(False, True), mla=(False, True),
        mla_dims=((12, 8), (24, 16), (80, 64)),
    )

    compile_fields = ("q_dtype", "mla", *Flex.compile_fields[1:])  # "mla": the key's dims are an MLA pair or not

    def __init__(self) -> None:
        if self.device == "cuda":  # Triton flex: dims >= 16, powers of two are its fast path
            self.capabilities = self.capabilities.replace(
                head_dims=(16, 32, 64, 128, 80, 576, 192), returns_lse=True, mla_dims=((80, 64), (576, 512), (192, 128)),
            )

    def plan(self, case: Case) -> dict[str, Any]:
        lay, device = case.layout, self.device
        batch = lay.batch_size
        sinks = case.options.sinks is not None
        qo, kv = np.asarray(lay.qo_lens), np.asarray(lay.kv_lens)
        doc_q = np.repeat(np.arange(batch), qo)
        local_q = np.concatenate([np.arange(n) for n in qo] or [np.zeros(0, int)])
        doc_k = np.repeat(np.arange(batch), kv)
        k_pos = np.concatenate([np.arange(n) for n in kv] or [np.zeros(0, int)])
        if sinks:  # one sink key per request, after the real keys
            doc_k, k_pos = np.concatenate([doc_k, np.arange(batch)]), np.concatenate([k_pos, np.full(batch, -1)])
        masks = case.masks()
        if masks is None:
            flat, offset = np.ones(1, bool), np.zeros(batch, int)
        else:
            flat = np.concatenate([m.reshape(-1) for m in masks] + [np.ones(1, bool)])
            offset = np.cumsum([0, *(m.size for m in masks)])[:-1]
        lq, lk = _bucket(len(doc_q), 512), _bucket(len(doc_k), 2048)  # the shapes flex pads to (one compile per key)
        put = lambda x, n, fill: torch.from_numpy(np.concatenate([x, np.full(n - len(x), fill)]).astype(np.int64)).to(device)  # noqa: E731
        return {
            "case": case,
            "doc_q": put(doc_q, lq, -1),
            "local_q": put(local_q, lq, 0),
            "q_pos": put(local_q + (kv - qo)[doc_q] if len(doc_q) else local_q, lq, 0),
            "doc_k": put(doc_k, lk, -2),
            "k_pos": put(k_pos, lk, 0),
            # the per-request tables and the flat mask padded too: a tensor the mods read is guarded on its shape
            "kv_len": put(kv, _bucket(batch + 1, 16), 0),
            "mask_offset": put(offset, _bucket(batch + 1, 16), 0),
            "mask": torch.from_numpy(np.concatenate([flat, np.zeros(_bucket(len(flat), 1 << 16) - len(flat), bool)])).to(device),
            "last_bit": len(flat) - 1,
        }

    def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
        case: Case = plan["case"]
        opts, device = case.options, tensors.q.device
        doc_q, local_q, q_pos, doc_k, k_pos = (plan[n] for n in ("doc_q", "local_q", "q_pos", "doc_k", "k_pos"))
        kv_len, mask_offset, mask = plan["kv_len"], plan["mask_offset"], plan["mask"]
        # every option is a tensor the mods read (a Python value would be a guard: one compile per value)
        as_tensor = lambda value: torch.tensor(value, device=device)  # noqa: E731
        causal, window, last_bit = as_tensor(opts.causal), as_tensor(opts.window_left), as_tensor(plan["last_bit"])

        def mask_mod(b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            same = doc_q[qi] == doc_k[kv]
            keep = same & (~causal | (k_pos[kv] <= q_pos[qi])) & ((window < 0) | (k_pos[kv] >= q_pos[qi] - window))
            doc = doc_q[qi].clamp(min=0)  # no mask: one True bit at 0 (``plan``)
            bit = torch.minimum((mask_offset[doc] + local_q[qi] * kv_len[doc] + k_pos[kv]).clamp(min=0), last_bit)
            return (keep & mask[bit]) | (same & (k_pos[kv] < 0))  # a sink key: every query of its request sees it

        scale, cap = as_tensor(case.sm_scale), as_tensor(opts.logits_soft_cap)
        slopes = as_tensor(opts.alibi_slopes or [0.0] * case.heads.num_qo_heads)
        use_sinks = opts.sinks is not None
        sink_logits = as_tensor(opts.sinks or [0.0] * case.heads.num_qo_heads)

        def score_mod(s: torch.Tensor, b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            s = s * scale
            s = torch.where(cap > 0, cap * torch.tanh(s / cap), s)  # cap 0: s itself
            s = s - slopes[h] * (q_pos[qi] - k_pos[kv]).abs()  # no ALiBi: slopes 0
            return torch.where(k_pos[kv] < 0, sink_logits[h].to(s.dtype), s)  # only sink keys have k_pos < 0

        lq, lk = len(doc_q), len(doc_k)
        pages, slots = (t.to(device) for t in token_addresses(case))
        q = tensors.q.new_zeros(lq, *tensors.q.shape[1:])
        q[: case.layout.total_q] = tensors.q
        k = tensors.k_cache.new_zeros(lk, *tensors.k_cache.shape[2:])
        k[: len(pages)] = tensors.k_cache[pages, slots]
        if case.heads.mla:  # V is the latent's first d_ckv dims: the same gathered rows
            v = k[..., : case.heads.head_dim_vo]
        else:
            v = tensors.v_cache.new_zeros(lk, *tensors.v_cache.shape[2:])
            v[: len(pages)] = tensors.v_cache[pages, slots]
        real_keys = len(pages) + (case.layout.batch_size if use_sinks else 0)
        block_mask = block_mask_of(mask_mod, lq, lk, device, used=(case.layout.total_q, real_keys))
        want_lse = device.type == "cuda"
        result = _compiled_flex()(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None].contiguous() if case.heads.mla else v.transpose(0, 1)[None],
            score_mod=score_mod,
            block_mask=block_mask,
            scale=1.0,
            enable_gqa=True,
            return_lse=want_lse,
        )
        out, lse = result if want_lse else (result, None)
        out = out[0].transpose(0, 1)[: case.layout.total_q]
        if lse is not None and not use_sinks:
            lse = lse[0].transpose(0, 1)[: case.layout.total_q].float()
        else:
            lse = None
        return KernelOutput(out, lse)
