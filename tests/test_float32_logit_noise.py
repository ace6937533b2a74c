"""The LSE's floor covers the float32 rounding of a kernel's logit dot products (``float32_logit_noise``).

A correct float32 kernel was flagged ``FAIL: lse max error 3.25e-07 > 2.48e-07 allowed`` on a one-key row (its LSE
is its logit; the float32 control happened to round to the exact logit, so the floor, an ulp of the LSE, decided).
A kernel may sum the ``d`` products of a logit in float32 in any order: ``gamma_(d+1) sm_scale sum_i |q_i k_i|``.
"""

from __future__ import annotations

import torch
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.quality.planted import correct_attention
from pa_oracle.fuzz.run import runner
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.reference import FLOAT32_UNIT, float32_logit_noise, half_ulp, plain_controls, reference
from pa_oracle.oracle.tensors import make_tensors
from pa_oracle.oracle.tolerance import compare

from pa_oracle.backends.base import KernelOutput


def _one_key_case(seed: int = 90, pages: int = 1) -> Case:
    return Case(Layout((0, 1), (0, 1), (0,), (1,), 16, pages), Heads(4, 1, 128, 128),
                Options(q_dtype="float32", kv_dtype="float32", causal=False), seed=seed)


def _with_lse_error(case: Case, error: float) -> tuple[KernelOutput, float]:
    """The reference's output, its LSE with ``error`` added on (row 0, head 0): (output, the LSE's half ulp there)."""
    tensors = make_tensors(case)
    ref = reference(case, tensors)
    lse = ref.lse.clone()
    lse[0, 0] += error
    return KernelOutput(ref.out.float(), lse.float()), float(half_ulp(ref.lse[0, 0], torch.float32))


def test_the_bound_is_gamma_d_times_the_scaled_norms() -> None:
    case = _one_key_case()
    tensors = make_tensors(case)
    q, k = tensors.q.double(), tensors.k_cache.double()[0, 0]  # one key, one KV head
    d = 128
    want = q.norm(dim=-1) * k.norm(dim=-1) * case.sm_scale * (d + 1) * FLOAT32_UNIT / (1 - (d + 1) * FLOAT32_UNIT)
    torch.testing.assert_close(float32_logit_noise(case, tensors), want, rtol=1e-12, atol=0)


def test_an_lse_a_few_ulps_off_on_a_one_key_row_passes_now_and_failed_on_the_ulp_floor() -> None:
    case = _one_key_case()
    tensors = make_tensors(case)
    ref = reference(case, tensors, logit_noise=True)
    # the float32 controls as they were when the kernel was flagged: rounded to the exact logit, so the ulp floor
    # decided (how a machine's float32 dot rounds varies: the controls actually computed may land a few ulps off)
    exact_controls = [(ref.out.float(), ref.lse.float())] * 2
    ulp_half = float(half_ulp(ref.lse[0, 0], torch.float32))
    output, _ = _with_lse_error(case, 8 * ulp_half)  # four float32 ulps of the logit: the flagged kernel's size
    before = compare(case, out=output.out, lse=output.lse, ref=ref, controls=exact_controls)
    assert not before.passed and "lse max error" in before.failures[0], before.failures  # what flagged the kernel
    assert runner.judge(case, tensors, output).passed


def test_an_lse_error_just_above_the_widened_limit_still_fails() -> None:
    case = _one_key_case()
    tensors = make_tensors(case)
    ref, controls = reference(case, tensors, logit_noise=True), plain_controls(case, tensors, torch.float32)
    noise = float32_logit_noise(case, tensors)
    exact, _ = _with_lse_error(case, 0.0)
    limit = compare(case, out=exact.out, lse=exact.lse, ref=ref, controls=controls, lse_noise=noise).lse.limit_max
    assert runner.judge(case, tensors, _with_lse_error(case, 0.97 * limit)[0]).passed
    verdict = runner.judge(case, tensors, _with_lse_error(case, 1.03 * limit)[0])
    assert not verdict.passed and any("lse max error" in f for f in verdict.failures), verdict.failures
    # gamma_129 * sm_scale * |q| |k| here (the worst summation order, by Cauchy-Schwarz): ~2e-4, about 470x the ulp
    # floor it replaces for this row, and still about 3 orders below a base-2 LSE's error (0.44 |lse|)
    assert limit < 1e-3


def sequential_sum_lse(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):  # type: ignore[no-untyped-def]
    """A correct float32 kernel whose LSE sums each logit's products one by one, last dim first (cumsum)."""
    out, _ = correct_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                               kv_last_page_len=kv_last_page_len, causal=False, sm_scale=q.shape[-1] ** -0.5,
                               window_left=-1, logits_soft_cap=0.0)
    page = k_cache.shape[1]
    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32)
    for b in range(len(qo_indptr) - 1):
        pages = kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
        kv_len = (len(pages) - 1) * page + int(kv_last_page_len[b]) if len(pages) else 0
        keys = k_cache[pages].reshape(-1, k_cache.shape[2], k_cache.shape[3])[:kv_len].float()
        rows = q[qo_indptr[b]:qo_indptr[b + 1]].float()
        group = rows.shape[1] // keys.shape[1]
        keys = keys.repeat_interleave(group, dim=1)  # [kv, Hq, d]
        products = (rows[:, None] * keys[None]).flip(-1)  # [qo, kv, Hq, d]
        logits = products.cumsum(-1)[..., -1] * q.shape[-1] ** -0.5
        lse[qo_indptr[b]:qo_indptr[b + 1]] = torch.logsumexp(logits, dim=1)
    return out, lse


def test_a_float32_kernel_summing_its_logits_in_another_order_is_not_flagged() -> None:
    kernel = UserKernel.from_spec(f"{__name__}:sequential_sum_lse")
    for seed in range(40):
        for kv_len in (1, 2, 5):
            case = Case(Layout((0, 1), (0, 1), (0,), (kv_len,), 16, 1), Heads(4, 2, 128, 128),
                        Options(q_dtype="float32", kv_dtype="float32", causal=False), seed=seed)
            outcome = check_case(kernel, case)
            assert outcome.status == "pass", (seed, kv_len, outcome.message)
