from __future__ import annotations

import torch
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.reference import plain_attention, reference
from pa_oracle.oracle.tensors import make_tensors
from pa_oracle.oracle.tolerance import compare

CASE = Case(Layout.from_lengths([3, 2, 1], [20, 0, 7], 4), Heads(4, 2, 16, 16), Options(q_dtype="bfloat16", kv_dtype="bfloat16"))


def judge(out, lse=None, case=CASE):
    tensors = make_tensors(case)
    ref = reference(case, tensors, logit_noise=True)
    controls = [plain_attention(case, tensors, torch.bfloat16, reorder_ops=r) for r in (False, True)]
    return compare(case, out=out, lse=lse, ref=ref, controls=controls), ref


def test_rounded_reference_passes() -> None:
    _, ref = judge(torch.zeros(6, 4, 16, dtype=torch.bfloat16))
    verdict, _ = judge(ref.out.to(torch.bfloat16), ref.lse.float())
    assert verdict.passed, verdict.failures


def test_a_small_error_on_one_element_fails_and_is_counted() -> None:
    _, ref = judge(torch.zeros(6, 4, 16, dtype=torch.bfloat16))
    out = ref.out.clone()
    out[0, 3, 5] += 0.1
    verdict, _ = judge(out.to(torch.bfloat16))
    assert not verdict.passed and verdict.out.mismatches == 1
    assert "out max error" in verdict.failures[0]


def test_nan_and_nonzero_empty_rows_and_finite_empty_lse_fail() -> None:
    _, ref = judge(torch.zeros(6, 4, 16, dtype=torch.bfloat16))
    out = ref.out.to(torch.bfloat16)
    out[0, 0, 0] = float("nan")
    out[3, 1, 0] = 1e-3  # row 3 belongs to the empty request 1
    lse = ref.lse.float().clone()
    lse[4] = -5e4  # FlashInfer#4401's finite sentinel instead of -inf
    verdict, _ = judge(out, lse)
    text = " ".join(verdict.failures)
    assert "non-finite" in text and "empty rows (no key to attend) are not exactly 0" in text
    assert "empty rows have lse" in text


def test_wrong_shape_and_dtype() -> None:
    verdict, _ = judge(torch.zeros(6, 4, 8, dtype=torch.bfloat16))
    assert not verdict.passed and "shape" in verdict.failures[0]
    _, ref = judge(torch.zeros(6, 4, 16, dtype=torch.bfloat16))
    verdict, _ = judge(ref.out.float())
    assert any("dtype" in f for f in verdict.failures)


def test_lse_in_base_two_is_caught() -> None:
    _, ref = judge(torch.zeros(6, 4, 16, dtype=torch.bfloat16))
    verdict, _ = judge(ref.out.to(torch.bfloat16), reference(CASE, make_tensors(CASE), lse_base="2").lse.float())
    assert not verdict.passed and any("lse max error" in f for f in verdict.failures)
