"""flash-attn ``flash_attn_with_kvcache(q, k_cache, v_cache, k=, v=, cache_seqlens=, block_table=)``:
appends ``k``/``v`` ([B, seqlen_new, H, D], one length for the batch) at each request's
``cache_seqlens`` in place, then attends; the pool is NHD, two tensors, paged with
``block_table`` [B, max_pages] (page size a multiple of 256 for flash-attn 2's paged KV)."""

from __future__ import annotations

from pa_oracle.backends.writes import WriteCapabilities, WriteKernel, register
from pa_oracle.oracle.append import AppendCase, AppendInputs


@register
class FlashAttnAppend(WriteKernel):
    name = "flash-attn-kvcache-append"
    package = "flash_attn"
    capabilities = WriteCapabilities(layouts=("NHD",), combined=(False,), dtypes=("bfloat16", "float16"),
                                     page_sizes=(256,), devices=("cuda",), same_append_len=True,
                                     head_dims=(64, 128))

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        import torch
        from flash_attn import flash_attn_with_kvcache

        batch, new = case.batch_size, case.append_lens[0]
        width = max(case.pages_per_request)
        table = torch.zeros((batch, width), dtype=torch.int32, device=inputs.kv_indices.device)
        for b in range(batch):
            start, end = int(inputs.kv_indptr[b]), int(inputs.kv_indptr[b + 1])
            table[b, : end - start] = inputs.kv_indices[start:end]
        heads, dim = case.num_kv_heads, case.head_dim
        q = torch.zeros((batch, max(new, 1), heads, dim), dtype=inputs.append_k.dtype, device=table.device)
        k = inputs.append_k.view(batch, new, heads, dim)
        v = inputs.append_v.view(batch, new, heads, dim)
        seqlens = torch.tensor(case.seq_lens_before, dtype=torch.int32, device=table.device)
        flash_attn_with_kvcache(q, inputs.k_pool, inputs.v_pool, k=k, v=v, cache_seqlens=seqlens, block_table=table)
