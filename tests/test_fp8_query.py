from __future__ import annotations

import math
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pa_oracle.backends import get_backend
from pa_oracle.backends.base import KernelOutput
from pa_oracle.backends.flashinfer_fp8 import fp8_prefill_uri
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.run.runner import check_case, judge
from pa_oracle.oracle.case import Case, CaseError, Heads, Layout, Options, Rope
from pa_oracle.oracle import reference as reference_module
from pa_oracle.oracle.reference import fp8_probabilities
from pa_oracle.oracle.tensors import make_tensors, query_values

from tests.fake_kernels import _module

E4M3 = "float8_e4m3fn"
FP8_Q = Options(causal=True, q_dtype=E4M3, kv_dtype=E4M3, q_scale=0.5, k_scale=0.75, v_scale=2.0, o_dtype="bfloat16")
CASE = Case(Layout.from_lengths([5, 3], [37, 20], 16), Heads(4, 2, 64, 64), FP8_Q, seed=11)


def test_an_fp8_q_needs_its_output_dtype_and_an_fp8_kv_and_other_qs_take_no_q_scale() -> None:
    with pytest.raises(CaseError, match="o_dtype"):
        Options(q_dtype=E4M3, kv_dtype=E4M3)
    with pytest.raises(CaseError, match="kv_dtype"):
        Options(q_dtype=E4M3, kv_dtype="bfloat16", o_dtype="bfloat16")
    with pytest.raises(CaseError, match="q_scale"):
        Options(q_dtype="bfloat16", kv_dtype="bfloat16", q_scale=0.5)
    with pytest.raises(CaseError, match="o_dtype"):
        Options(q_dtype="bfloat16", kv_dtype="bfloat16", o_dtype="float16")
    with pytest.raises(CaseError, match="rope"):
        Options(q_dtype=E4M3, kv_dtype=E4M3, o_dtype="float16", rope=Rope())
    assert FP8_Q.out_dtype == "bfloat16" and Options(q_dtype="float16", kv_dtype="float16").out_dtype == "float16"


def test_the_fp8_q_fields_round_trip_and_stay_out_of_other_cases_json() -> None:
    again = Case.from_json(CASE.to_json())
    assert again == CASE and again.case_id == CASE.case_id
    plain = Case(CASE.layout, CASE.heads, Options(causal=True, q_dtype="bfloat16", kv_dtype="bfloat16"), seed=11)
    assert not {"q_scale", "o_dtype"} & set(plain.to_json()["options"])
    assert "q_scale=0.5 o=bfloat16" in CASE.summary()


def test_q_is_stored_as_value_over_q_scale_in_e4m3() -> None:
    tensors = make_tensors(CASE)
    assert tensors.q.dtype == torch.float8_e4m3fn
    unscaled = make_tensors(CASE.replace(options=Options(causal=True, q_dtype="float32", kv_dtype=E4M3, k_scale=0.75, v_scale=2.0)))
    expected = (unscaled.q / 0.5).to(torch.float8_e4m3fn)
    assert torch.equal(tensors.q.view(torch.uint8), expected.view(torch.uint8))
    assert torch.equal(query_values(CASE, tensors, torch.float64), tensors.q.double() * 0.5)


def test_fp8_probabilities_round_each_row_on_the_fp8_grid_of_its_largest_weight() -> None:
    p = torch.softmax(torch.randn(3, 40, dtype=torch.float64), -1)
    q = fp8_probabilities(p, torch.float8_e4m3fn)
    scale = 448 / p.amax(-1, keepdim=True)
    on_grid = (p * scale).float().to(torch.float8_e4m3fn).double()
    torch.testing.assert_close(q * scale, on_grid, rtol=1e-6, atol=0)  # float32 scaling in between
    torch.testing.assert_close(q.amax(-1), p.amax(-1), rtol=1e-6, atol=0)  # the largest weight stays (448)
    assert 0 < float(((q - p).abs() / p).max()) < 2**-3


def _fp8_attention(case: Case, tensors, *, quantize_p: bool = True, use_q_scale: bool = True):  # type: ignore[no-untyped-def]
    """What the fp8 tensor-core kernel computes: fp32 logits of the fp8 codes, scaled by
    q_scale * k_scale * sm_scale; exp(s - max) * 448 rounded to e4m3 before P @ V; v_scale / 448 after."""
    lay, opts, heads = case.layout, case.options, case.heads
    out = torch.zeros(lay.total_q, heads.num_qo_heads, heads.head_dim_vo, dtype=getattr(torch, opts.out_dtype))
    lse = torch.full((lay.total_q, heads.num_qo_heads), -math.inf)
    flat_k = tensors.k_cache.float()
    flat_v = tensors.v_cache.float()
    scale = case.sm_scale * opts.k_scale * (opts.q_scale if use_q_scale else 1.0)
    for b in range(lay.batch_size):
        rows = slice(lay.qo_indptr[b], lay.qo_indptr[b + 1])
        qo, kv = lay.qo_lens[b], lay.kv_lens[b]
        if qo == 0 or kv == 0:
            continue
        pages = list(lay.pages_of(b))
        k = flat_k[pages].flatten(0, 1)[:kv].repeat_interleave(heads.group_size, 1)
        v = flat_v[pages].flatten(0, 1)[:kv].repeat_interleave(heads.group_size, 1)
        s = torch.einsum("qhd,khd->hqk", tensors.q[rows].float(), k) * scale
        q_pos, k_pos = torch.arange(kv - qo, kv)[:, None], torch.arange(kv)[None, :]
        keep = (k_pos <= q_pos) if opts.causal else torch.ones(qo, kv, dtype=torch.bool)
        if opts.window_left >= 0:
            keep = keep & (k_pos >= q_pos - opts.window_left)
        s = s.masked_fill(~keep, -math.inf)
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isinf(m), 0.0, m)
        p = torch.exp(s - m)
        total = p.sum(-1)
        p8 = (p * 448).to(torch.float8_e4m3fn).float() / 448 if quantize_p else p
        o = torch.einsum("hqk,khd->qhd", p8, v) * opts.v_scale / torch.where(total == 0, 1.0, total).T[..., None]
        out[rows] = o.to(out.dtype)
        lse[rows] = torch.where(total == 0, -math.inf, m[..., 0] + torch.log(total)).T
    return KernelOutput(out, lse)


def test_the_control_rounds_p_as_the_fp8_kernel_does_so_it_passes_and_an_ignored_q_scale_fails() -> None:
    tensors = make_tensors(CASE)
    verdict = judge(CASE, tensors, _fp8_attention(CASE, tensors))
    assert verdict.passed, verdict.failures
    assert judge(CASE, tensors, _fp8_attention(CASE, tensors, quantize_p=False)).passed  # more accurate passes too
    assert not judge(CASE, tensors, _fp8_attention(CASE, tensors, use_q_scale=False)).passed
    with pytest.MonkeyPatch.context() as mp:  # a control that keeps P in 16 bits fails the correct fp8 kernel
        mp.setattr(reference_module, "fp8_probabilities", lambda p, fp8: p)
        assert not judge(CASE, tensors, _fp8_attention(CASE, tensors)).passed


# --- the adapter through a CPU stand-in of FlashInfer's fa3 fp8 prefill ---------------------------


class FakeFP8Prefill:
    """``BatchPrefillWithPagedKVCacheWrapper(backend="fa3")`` for an fp8 q: plan(q/kv/o data types),
    run(q, (k, v), scale_q, scale_k, scale_v, return_lse=True), LSE base 2."""

    def __init__(self, workspace, kv_layout="NHD", backend="auto"):  # type: ignore[no-untyped-def]
        assert kv_layout == "NHD" and backend == "fa3"

    def plan(self, qo_indptr, kv_indptr, kv_indices, last, num_qo_heads, num_kv_heads, head_dim, page_size, *, causal,
             pos_encoding_mode, window_left, logits_soft_cap, sm_scale, q_data_type, kv_data_type, o_data_type):  # type: ignore[no-untyped-def]
        assert q_data_type == kv_data_type == torch.float8_e4m3fn and o_data_type in (torch.float16, torch.bfloat16)
        assert pos_encoding_mode == "NONE" and logits_soft_cap is None
        self.layout = [tuple(x.tolist()) for x in (qo_indptr, kv_indptr, kv_indices, last)] + [page_size]
        self.causal, self.window_left, self.sm_scale, self.o_dtype = causal, window_left, sm_scale, o_data_type

    def run(self, q, paged_kv_cache, *scales, return_lse=False):  # type: ignore[no-untyped-def]
        assert len(scales) == 3 and all(s.dtype == torch.float32 for s in scales)
        k_cache, v_cache = paged_kv_cache
        lay = self.layout
        o_dtype = {torch.float16: "float16", torch.bfloat16: "bfloat16"}[self.o_dtype]
        options = Options(causal=self.causal, window_left=self.window_left, sm_scale=self.sm_scale, q_dtype=E4M3, kv_dtype=E4M3,
                          q_scale=float(scales[0][0]), k_scale=float(scales[1][0]), v_scale=float(scales[2][0]), o_dtype=o_dtype)
        case = Case(Layout(*lay, k_cache.shape[0]),
                    Heads(q.shape[1], k_cache.shape[2], q.shape[2], v_cache.shape[3]), options)
        out, lse = _fp8_attention(case, type("T", (), {"q": q, "k_cache": k_cache, "v_cache": v_cache})())
        return out, lse / math.log(2.0)


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_the_fp8_adapter_agrees_with_the_oracle_through_a_cpu_stand_in(data: st.DataObject) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "flashinfer", _module("flashinfer", BatchPrefillWithPagedKVCacheWrapper=FakeFP8Prefill))
        backend = get_backend("flashinfer-prefill-fa3-fp8")
        mp.setattr(type(backend), "device", property(lambda self: "cpu"))
        limits = Limits(max_batch=3, max_kv_len=48, max_qo_len=12, max_kv_heads=2, max_qo_heads=4)
        case = data.draw(cases(backend.capabilities.replace(devices=("cpu",)), limits), label="case")
        assert case.options.q_dtype == E4M3 and case.options.o_dtype in ("float16", "bfloat16")
        outcome = check_case(backend, case)
    assert outcome.status == "pass", outcome.message


def test_the_fp8_module_name_has_the_output_dtype() -> None:
    key = (("q_dtype", E4M3), ("kv_dtype", E4M3), ("o_dtype", "bfloat16"), ("head_dim_qk", 128), ("window", False))
    assert get_backend("flashinfer-prefill-fa3-fp8").compile_key(CASE.replace(heads=Heads(4, 2, 128, 128))) == key
    assert fp8_prefill_uri(key) == (
        "batch_prefill_with_kv_cache_dtype_q_e4m3_dtype_kv_e4m3_dtype_o_bf16_dtype_idx_i32_head_dim_qk_128_head_dim_vo_128_"
        "posenc_0_use_swa_False_use_logits_cap_False_f16qk_False_sm90"
    )
