from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pa_oracle.backends import get_backend
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.run.runner import check_case

from tests.fake_kernels import _module, fake_engine_modules

_DECODE = "sglang.srt.layers.attention.triton_ops.decode_attention"
LIMITS = Limits(max_batch=3, max_kv_len=40, max_qo_len=6, max_kv_heads=1, max_qo_heads=4)


def fake_decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
                              max_kv_splits, sm_scale, k_scale, v_scale, logit_cap=0.0, sinks=None, xai_temperature_len=-1):
    """SGLang's decode_attention_fwd as its source reads (triton_ops/decode_attention.py): Lk = 576 is
    split into BLOCK_DMODEL 512 + BLOCK_DPE 64 (two dot products), Lv = v_buffer.shape[-1], V read
    through v_buffer's own strides, kv_group_num = Hq // v_buffer.shape[1], logits scaled by
    sm_scale * k_scale, capped, out times v_scale; attn_logits [B, Hq, splits, Lv], attn_lse [B, Hq, splits]."""
    batch, heads, lk = q.shape
    lv = v_buffer.shape[-1]
    assert lk == k_buffer.shape[-1] == 576 and lv == 512 and o.shape == (batch, heads, lv)
    assert v_buffer.data_ptr() == k_buffer.data_ptr() and v_buffer.stride(0) == k_buffer.stride(0)  # a view: V = K[..., :512]
    assert attn_logits.shape == (batch, heads, max_kv_splits, lv) and attn_lse.shape == (batch, heads, max_kv_splits)
    assert attn_logits.is_contiguous() and attn_lse.is_contiguous()  # stage 1 addresses the LSE as offset // Lv
    assert kv_indptr.dtype == torch.int32 and kv_indices.dtype == torch.int64 and num_kv_splits.shape == (batch,)
    for b in range(batch):
        slots = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])]
        k, v = k_buffer[slots].double() * k_scale, v_buffer[slots].double() * v_scale
        s = (torch.einsum("hd,kd->hk", q[b, :, :512].double(), k[:, 0, :512])
             + torch.einsum("hd,kd->hk", q[b, :, 512:].double(), k[:, 0, 512:])) * sm_scale
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        total = torch.logsumexp(s, -1) if sinks is None else torch.logaddexp(torch.logsumexp(s, -1), sinks.double())
        o[b] = (torch.exp(s - total[:, None]) @ v[:, 0]).to(o.dtype)


@pytest.mark.parametrize("name", ["sglang-decode-mla", "sglang-extend-mla"])
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_sglang_mla_adapters_agree_with_the_oracle_through_a_cpu_stand_in(name: str, data: st.DataObject) -> None:
    with fake_engine_modules() as mp:
        mp.setitem(sys.modules, _DECODE, _module("decode_attention", decode_attention_fwd=fake_decode_attention_fwd))
        backend = get_backend(name)
        mp.setattr(type(backend), "device", property(lambda self: "cpu"))
        caps = backend.capabilities
        assert caps.mla == (True,) and caps.mla_dims == ((576, 512),)
        case = data.draw(cases(caps.replace(devices=("cpu",)), LIMITS), label="case")
        assert case.heads.mla and case.heads.num_kv_heads == 1
        assume(backend.unsupported_reason(case) is None)  # a declared precondition (e.g. SGLang's window_left 0) skips
        outcome = check_case(backend, case)
    assert outcome.status == "pass", f"{name}: {outcome.message}"
