"""CPU stand-ins for the engine kernels, each written from its library's conventions as read in
its source (masks, ALiBi offset, sink, LSE base and layout, index semantics) and not from the
adapters, so that an adapter's conversions can be judged against the oracle without a GPU.
Float64 math, no precision model: they check plumbing and conventions, not kernel accuracy.
"""

from __future__ import annotations

import contextlib
import math
import sys
import types
from collections.abc import Iterator

import pytest
import torch

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def attend(q, k, v, keep, *, scale, cap=0.0, bias=None, sink=None):
    """Softmax attention of q [n, H, D] over k/v [m, Hkv, D] where ``keep`` [n, m] (or
    [H, n, m]): (out [n, H, Dv] float64, LSE [n, H] natural log over the kept keys only)."""
    group = q.shape[1] // max(k.shape[1], 1)
    k64, v64 = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = torch.einsum("nhd,mhd->hnm", q.double(), k64) * scale
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~keep.expand_as(s), -math.inf)
    lse = torch.logsumexp(s, -1)
    total = lse if sink is None else torch.logaddexp(lse, sink.double()[:, None])
    weights = torch.nan_to_num(torch.exp(s - total[..., None]), nan=0.0)
    return torch.einsum("hnm,mhd->nhd", weights, v64), lse.T


def _dequant(x: torch.Tensor, scale: float | torch.Tensor | None) -> torch.Tensor:
    if x.dtype in FP8:
        return x.double() * float(scale.flatten()[0] if isinstance(scale, torch.Tensor) else scale)
    return x


def _paged_tokens(cache: torch.Tensor, pages: list[int], kv_len: int) -> torch.Tensor:
    if kv_len == 0:
        return cache[:0, 0]
    return torch.cat([cache[p] for p in pages])[:kv_len]


# --- flashinfer ---------------------------------------------------------------------------


class _FlashInferWrapper:
    decode = False

    def __init__(self, workspace, kv_layout="NHD", use_tensor_cores=False, backend="auto"):
        assert kv_layout == "NHD"

    def _plan(self, qo_indptr, kv_indptr, kv_indices, last, page_size, causal, sm_scale, window_left, logits_soft_cap):
        self.qo_indptr, self.kv_indptr = qo_indptr.tolist(), kv_indptr.tolist()
        self.kv_indices, self.last = kv_indices.tolist(), last.tolist()
        self.page_size, self.causal, self.scale = page_size, causal, sm_scale
        self.window_left, self.cap = window_left, logits_soft_cap or 0.0

    def run(self, q, paged_kv_cache, *, k_scale=None, v_scale=None, out=None, return_lse=False):
        k_cache, v_cache = paged_kv_cache.unbind(1)  # [pages, 2, page_size, Hkv, D]
        lse = torch.empty(q.shape[:2], dtype=torch.float32)
        for i in range(len(self.last)):
            pages = self.kv_indices[self.kv_indptr[i] : self.kv_indptr[i + 1]]  # indptr offsets into the indices
            kv_len = (len(pages) - 1) * self.page_size + self.last[i] if pages else 0
            rows = slice(self.qo_indptr[i], self.qo_indptr[i + 1])
            qo_len = rows.stop - rows.start
            q_pos, k_pos = torch.arange(kv_len - qo_len, kv_len)[:, None], torch.arange(kv_len)[None, :]
            keep = torch.ones(qo_len, kv_len, dtype=torch.bool)
            if self.causal:
                keep &= k_pos <= q_pos
            if self.window_left >= 0:
                keep &= k_pos >= q_pos - self.window_left
            keys = _dequant(_paged_tokens(k_cache, pages, kv_len), k_scale)
            values = _dequant(_paged_tokens(v_cache, pages, kv_len), v_scale)
            o, l = attend(q[rows], keys, values, keep, scale=self.scale, cap=self.cap)
            out[rows] = o.to(out.dtype)
            lse[rows] = (l / math.log(2.0)).float()  # FlashInfer's LSE is base 2
        return (out, lse) if return_lse else out


class FakePrefillWrapper(_FlashInferWrapper):
    def plan(self, qo_indptr, kv_indptr, kv_indices, last, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             causal=False, sm_scale=None, window_left=-1, logits_soft_cap=None, q_data_type=None, kv_data_type=None,
             fixed_split_size=None, disable_split_kv=False):
        self._plan(qo_indptr, kv_indptr, kv_indices, last, page_size, causal, sm_scale, window_left, logits_soft_cap)


class FakeDecodeWrapper(_FlashInferWrapper):
    def plan(self, kv_indptr, kv_indices, last, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             pos_encoding_mode="NONE", sm_scale=None, window_left=-1, logits_soft_cap=None, q_data_type=None,
             kv_data_type=None, fixed_split_size=None, disable_split_kv=False):
        assert pos_encoding_mode == "NONE"
        self._plan(torch.arange(len(last) + 1), kv_indptr, kv_indices, last, page_size, False, sm_scale, window_left, logits_soft_cap)


# --- SGLang extend ------------------------------------------------------------------------


def fake_extend_attention_fwd(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr,
                              kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale,
                              sm_scale=None, logit_cap=0.0, skip_prefix_custom_mask=True, sliding_window_size=-1,
                              sinks=None, window_kv_offsets=None, xai_temperature_len=-1):
    assert custom_mask is None and max_len_extend == int((qo_indptr[1:] - qo_indptr[:-1]).max())
    for b in range(len(qo_indptr) - 1):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        prefix_slots = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])]
        prefix, extend = len(prefix_slots), rows.stop - rows.start
        keys = torch.cat([_dequant(k_buffer[prefix_slots], k_scale).double(), k_extend[rows].double()])
        values = torch.cat([_dequant(v_buffer[prefix_slots], v_scale).double(), v_extend[rows].double()])
        q_id, kv_id = (prefix + torch.arange(extend))[:, None], torch.arange(prefix + extend)[None, :]
        keep = torch.ones(extend, prefix + extend, dtype=torch.bool)
        if is_causal:  # stage 2 only: the extend part, m >= n
            keep &= (kv_id < prefix) | (q_id >= kv_id)
        if sliding_window_size > 0:
            keep &= q_id <= kv_id + sliding_window_size
        o, _ = attend(q_extend[rows], keys, values, keep, scale=sm_scale, cap=logit_cap, sink=sinks)
        o_extend[rows] = o.to(o_extend.dtype)


# --- vLLM unified_attention ---------------------------------------------------------------


def fake_unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale, causal,
                           window_size, block_table, softcap, q_descale, k_descale, v_descale, alibi_slopes=None,
                           output_scale=None, qq_bias=None, sinks=None):
    assert causal and q_descale is None
    sliding_window = 1 + window_size[0]
    for b in range(len(seqused_k)):
        rows = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]))
        seq_len, query_len = int(seqused_k[b]), rows.stop - rows.start
        context_len = seq_len - query_len
        pages = block_table[b].tolist()
        keys = _dequant(_paged_tokens(k, pages, seq_len), k_descale)
        values = _dequant(_paged_tokens(v, pages, seq_len), v_descale)
        query_abs, seq_offset = (context_len + torch.arange(query_len))[:, None], torch.arange(seq_len)[None, :]
        keep = seq_offset <= query_abs
        if sliding_window > 0:
            keep &= (query_abs - seq_offset) < sliding_window
        bias = None
        if alibi_slopes is not None:
            bias = alibi_slopes.double()[:, None, None] * (seq_offset - context_len).double()[None]
        o, _ = attend(q[rows], keys, values, keep, scale=softmax_scale, cap=softcap, bias=bias, sink=sinks)
        out[rows] = o.to(out.dtype)


# --- flash-attn 3 / 4 ---------------------------------------------------------------------


def _flash_varlen(q, keys_of, cu_seqlens_q, kv_lens, *, scale, causal, left, right, cap, sink=None, open_side=-1):
    """Shared by the FA3/FA4 stand-ins: bottom-right aligned window [p - left, p + right]."""
    out = torch.empty(q.shape[0], q.shape[1], keys_of(0)[1].shape[-1], dtype=q.dtype)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32)
    for b, kv_len in enumerate(kv_lens):
        rows = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]))
        qo_len = rows.stop - rows.start
        keys, values = keys_of(b)
        q_pos, k_pos = (kv_len - qo_len + torch.arange(qo_len))[:, None], torch.arange(kv_len)[None, :]
        keep = torch.ones(qo_len, kv_len, dtype=torch.bool)
        if causal:
            right = 0
        if left != open_side:
            keep &= k_pos >= q_pos - left
        if right != open_side:
            keep &= k_pos <= q_pos + right
        o, l = attend(q[rows], keys, values, keep, scale=scale, cap=cap, sink=sink)
        out[rows] = o.to(out.dtype)
        if sink is not None:  # FA4: the sink "enlarges the normalizer and the LSE"
            l = torch.logaddexp(l, sink.double()[None, :])
        lse[:, rows] = l.T.float()
    return out, lse


def fake_fa3_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                          cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                          cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                          q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                          window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                          scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0, return_softmax_lse=False):
    kv_lens = cache_seqlens.tolist()

    def keys_of(b):
        pages = page_table[b].tolist()
        return _paged_tokens(k_cache, pages, kv_lens[b]), _paged_tokens(v_cache, pages, kv_lens[b])

    out, lse = _flash_varlen(q, keys_of, cu_seqlens_q, kv_lens, scale=softmax_scale, causal=causal,
                             left=window_size[0], right=window_size[1], cap=softcap)
    lse = torch.where(torch.isneginf(lse), math.inf, lse)  # flash-attn 2's convention for an empty row
    return (out, lse) if return_softmax_lse else out


def fake_fa3_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None, seqused_k=None,
                    softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None, v_descale=None,
                    window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1, pack_gqa=None,
                    deterministic=False, sm_margin=0, return_attn_probs=False):
    starts = cu_seqlens_k.tolist()
    kv_lens = [b - a for a, b in zip(starts, starts[1:])]
    out, lse = _flash_varlen(q, lambda b: (k[starts[b] : starts[b + 1]], v[starts[b] : starts[b + 1]]), cu_seqlens_q,
                             kv_lens, scale=softmax_scale, causal=causal, left=window_size[0], right=window_size[1], cap=softcap)
    return (out, lse) if return_attn_probs else out


def fake_fa3_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                                cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None, cu_seqlens_q=None,
                                cu_seqlens_k_new=None, cache_leftpad=None, page_size=None, max_seqlen_k_new=0,
                                causal=False, window_size=(-1, -1), attention_chunk=0, has_softcap=False, num_splits=0,
                                pack_gqa=None, sm_margin=0):
    return torch.zeros(batch_size + 1, dtype=torch.int32)


def fake_fa4_varlen(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, seqused_q=None,
                    seqused_k=None, page_table=None, softmax_scale=None, causal=False, window_size=(None, None),
                    learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, return_lse=False):
    assert learnable_sink is None or learnable_sink.dtype == torch.bfloat16
    if page_table is not None:
        kv_lens = seqused_k.tolist()
        keys_of = lambda b: (_paged_tokens(k, page_table[b].tolist(), kv_lens[b]),  # noqa: E731
                             _paged_tokens(v, page_table[b].tolist(), kv_lens[b]))
    else:
        starts = cu_seqlens_k.tolist()
        kv_lens = [b - a for a, b in zip(starts, starts[1:])]
        keys_of = lambda b: (k[starts[b] : starts[b + 1]], v[starts[b] : starts[b + 1]])  # noqa: E731
    out, lse = _flash_varlen(q, keys_of, cu_seqlens_q, kv_lens, scale=softmax_scale, causal=causal, left=window_size[0],
                             right=window_size[1], cap=softcap, sink=learnable_sink, open_side=None)
    return out, (lse if return_lse else None)


# --- installation -------------------------------------------------------------------------


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


@contextlib.contextmanager
def fake_engine_modules() -> Iterator[pytest.MonkeyPatch]:
    """Install the stand-ins under the libraries' module names (and forget cached imports)."""
    from pa_oracle.backends import sglang_extend, vllm_triton

    modules = {
        "flashinfer": _module("flashinfer", BatchPrefillWithPagedKVCacheWrapper=FakePrefillWrapper,
                              BatchDecodeWithPagedKVCacheWrapper=FakeDecodeWrapper),
        "sglang.srt.layers.attention.triton_ops.extend_attention": _module("extend_attention", extend_attention_fwd=fake_extend_attention_fwd),
        "vllm.v1.attention.ops.triton_unified_attention": _module("triton_unified_attention", unified_attention=fake_unified_attention),
        "flash_attn_interface": _module("flash_attn_interface", flash_attn_with_kvcache=fake_fa3_with_kvcache,
                                        flash_attn_varlen_func=fake_fa3_varlen, get_scheduler_metadata=fake_fa3_scheduler_metadata),
        "flash_attn.cute.interface": _module("interface", flash_attn_varlen_func=fake_fa4_varlen),
    }
    caches = (sglang_extend._kernel, vllm_triton._unified_attention)
    with pytest.MonkeyPatch.context() as mp:
        for name, module in modules.items():
            mp.setitem(sys.modules, name, module)
        for cache in caches:
            cache.cache_clear()
        try:
            yield mp
        finally:
            for cache in caches:
                cache.cache_clear()
