from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from pa_oracle.backends import discover, get_backend
from pa_oracle.backends.user import UserKernel, capabilities_of, declare
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
from pa_oracle.fuzz.draw.strategies import FP8_SCALES, Limits, cases
from pa_oracle.fuzz.quality import planted_mla_fp8q, selftest
from pa_oracle.fuzz.run.runner import judge
from pa_oracle.oracle.case import FP8_DTYPES, Case, Heads, Layout, Options
from pa_oracle.oracle.tensors import make_tensors

SMALL = Limits(max_batch=3, max_kv_len=16, max_qo_len=4, max_qo_heads=4)
CAPS = capabilities_of(planted_mla_fp8q.correct_mla_fp8_q)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cases(CAPS, SMALL))
def test_a_kernel_declaring_mla_and_fp8_q_draws_mla_cases_with_its_fp8_q(case: Case) -> None:
    assert case.heads.mla and CAPS.unsupported_reason(case) is None
    opts = case.options
    if opts.q_is_fp8:
        assert opts.kv_dtype in FP8_DTYPES and opts.k_scale == opts.v_scale  # one latent cache, one scale
        assert opts.q_scale in FP8_SCALES and opts.o_dtype in CAPS.o_dtypes and opts.rope is None


def test_the_mla_fp8_q_draw_reaches_a_q_scale_other_than_one() -> None:
    drawn = find(cases(CAPS, SMALL), lambda c: c.options.q_is_fp8 and c.options.q_scale != 1.0)
    assert drawn.heads.mla and drawn.options.q_dtype == "float8_e4m3fn"


def test_an_mla_kernel_naming_rope_and_q_scale_draws_fp8_q_without_rope() -> None:
    @declare(mla=(True,), mla_dims=((12, 8),))
    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,  # type: ignore[no-untyped-def]
               window_left, logits_soft_cap, k_scale, v_scale, q_scale, out_dtype, rope=None):
        raise AssertionError("never run")

    caps = capabilities_of(kernel)
    fp8 = find(cases(caps, SMALL), lambda c: c.options.q_is_fp8)
    assert fp8.heads.mla and fp8.options.rope is None  # the case model refuses RoPE of an fp8 q: never drawn
    assert find(cases(caps, SMALL), lambda c: c.options.rope is not None).heads.mla


def _library_mla() -> list[str]:
    return sorted(name for name in discover() if True in get_backend(name).capabilities.mla)  # an adapter may set them in __init__


def test_no_library_mla_adapter_declares_an_fp8_q() -> None:
    names = _library_mla()
    assert {"flashinfer-mla", "flashinfer-mla-fa3", "sglang-decode-mla", "sglang-extend-mla"} <= set(names), names
    for name in names:  # FlashInfer's BatchMLAPagedAttentionWrapper and SGLang's Triton kernels take no q scale
        assert not set(get_backend(name).capabilities.q_dtypes) & set(FP8_DTYPES), name


def test_an_mla_user_kernel_gets_the_fp8_q_its_scale_and_output_dtype() -> None:
    seen: dict[str, Any] = {}

    @declare(mla=(True,), mla_dims=((12, 8),))
    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,  # type: ignore[no-untyped-def]
               window_left, logits_soft_cap, k_scale, v_scale, q_scale, out_dtype):
        seen.update(q=q.clone(), q_scale=q_scale, k_scale=k_scale, out_dtype=out_dtype, sm_scale=sm_scale)
        return torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=out_dtype)

    opts = Options(q_dtype="float8_e4m3fn", kv_dtype="float8_e4m3fn", q_scale=0.25, k_scale=0.5, v_scale=0.5, o_dtype="float16")
    case = Case(Layout.from_lengths([2, 1], [5, 3], page_size=4), Heads(2, 1, 12, 8, mla=True), opts, seed=4)
    tensors = make_tensors(case)
    UserKernel(kernel).run(case, tensors)
    assert torch.equal(seen["q"].view(torch.uint8), tensors.q.view(torch.uint8))  # the stored codes, both parts
    assert (seen["q_scale"], seen["k_scale"], seen["out_dtype"], seen["sm_scale"]) == (0.25, 0.5, torch.float16, case.sm_scale)


def test_the_judge_passes_the_correct_kernel_and_fails_each_planted_one_on_a_hand_case() -> None:
    opts = Options(causal=True, q_dtype="float8_e4m3fn", kv_dtype="float8_e4m3fn", q_scale=0.5, k_scale=0.75, v_scale=0.75,
                   o_dtype="bfloat16")
    case = Case(Layout.from_lengths([2, 3], [20, 9], page_size=4), Heads(4, 1, 24, 16, mla=True), opts, seed=7)
    tensors = make_tensors(case)
    for name in (*planted_mla_fp8q.CORRECT, *planted_mla_fp8q.PLANTED):
        verdict = judge(case, tensors, UserKernel(getattr(planted_mla_fp8q, name)).run(case, tensors))
        assert verdict.passed == (name in planted_mla_fp8q.CORRECT), (name, verdict.failures)


@pytest.mark.parametrize("bug", planted_mla_fp8q.PLANTED)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_mla_fp8_q_bug_is_found_within_a_few_examples(bug: str, seed: int) -> None:
    found = fuzz_backend(UserKernel(getattr(planted_mla_fp8q, bug)),
                         CampaignConfig(examples=50, seed=seed, isolate=False, shrink_seconds=5.0))
    assert found.finding is not None, (bug, seed, found.examples)
    assert found.examples <= 8, (bug, seed, found.examples)  # measured: 4 on each seed
    options = found.finding.case.options
    assert found.finding.case.heads.mla and options.q_is_fp8 and options.q_scale != 1.0, found.finding.case.summary()


def test_the_bugs_hide_from_a_kernel_that_declares_no_fp8_q() -> None:
    blind = declare(**{**planted_mla_fp8q._CAPABILITIES, "q_dtypes": ("bfloat16",)})(
        planted_mla_fp8q._mla_fp8_q_kernel("mla_fp8_q_pe_unscaled"))
    missed = fuzz_backend(UserKernel(blind), CampaignConfig(examples=40, seed=0, isolate=False))
    assert missed.finding is None and missed.examples == 40  # a 16-bit q: the bug cannot show


def test_the_correct_mla_fp8_q_kernel_stays_clean_over_150_cases() -> None:
    result = fuzz_backend(UserKernel(planted_mla_fp8q.correct_mla_fp8_q), CampaignConfig(examples=150, seed=0, isolate=False))
    assert result.finding is None and result.examples == 150
    assert result.coverage.counts["q_dtype"].get("float8_e4m3fn", 0) >= 30  # the fp8 q MLA cases were judged


def test_the_selftest_runs_the_mla_fp8_q_kernels() -> None:
    names = {name for module, name in selftest.selftest_kernels() if module is planted_mla_fp8q}
    assert names == {"mla_fp8_q_pe_unscaled", "mla_fp8_q_scale_twice", "correct_mla_fp8_q"}
