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


def _definition(kernel: torch.Tensor, controls: list[torch.Tensor], ref: torch.Tensor) -> tuple[float, float, float, float]:
    """(max, mean) of the kernel's and the controls' error over the finite reference elements, by
    boolean-mask indexing: what ``compare`` reduces without reading the mask back first."""
    mask = torch.isfinite(ref)
    err = (kernel.double() - ref).abs().nan_to_num(nan=float("inf"), posinf=float("inf"))[mask]
    ctrl = torch.stack([(c.double() - ref).abs() for c in controls]).amax(0)[mask]
    return float(err.max()), float(err.mean()), float(ctrl.max()), float(ctrl.mean())


def test_the_stats_are_the_masked_reductions_bit_for_bit() -> None:
    # lse has -inf rows (the empty request) and the kernel's out is a non-contiguous view with a NaN:
    # the reductions must be those over the finite reference elements, in their logical order
    tensors = make_tensors(CASE)
    ref = reference(CASE, tensors, logit_noise=True)
    controls = [plain_attention(CASE, tensors, torch.bfloat16, reorder_ops=r) for r in (False, True)]
    out = ref.out.to(torch.bfloat16).transpose(0, 1).contiguous().transpose(0, 1)
    out[1, 2, 3] = float("nan")
    lse = ref.lse.float() + 1e-4
    lse[3] = float("-inf")  # the empty request's row: right
    verdict = compare(CASE, out=out, lse=lse, ref=ref, controls=controls)
    for stats, kernel, which, reference_values in ((verdict.out, out, 0, ref.out), (verdict.lse, lse, 1, ref.lse)):
        want = _definition(kernel, [c[which] for c in controls], reference_values)
        assert (stats.max_error, stats.mean_error, stats.control_max_error, stats.control_mean_error) == want
        assert stats.numel == int(torch.isfinite(reference_values).sum())
    assert verdict.out.max_error == float("inf") and verdict.out.mismatches == 1
    assert verdict.lse.numel < ref.lse.numel()  # the empty row is left out
    assert verdict.failures[0].startswith("out has 1 non-finite elements (NaN 1)")


def test_knowing_the_empty_rows_on_the_host_changes_no_verdict() -> None:
    # ``empty_rows`` (``Plan.empty_rows``) skips passes or a wait: the verdict, stats and error
    # tensors must be those of the comparison that finds the empty rows on the device itself
    full = Case(Layout.from_lengths([3, 1], [20, 7], 4), Heads(4, 2, 16, 16), Options(q_dtype="bfloat16", kv_dtype="bfloat16"))
    for case, known in ((CASE, True), (full, False)):
        tensors = make_tensors(case)
        ref = reference(case, tensors, logit_noise=True)
        controls = [plain_attention(case, tensors, torch.bfloat16, reorder_ops=r) for r in (False, True)]
        out, lse = ref.out.to(torch.bfloat16), ref.lse.float() + 1e-4
        out[0, 1, 2] += 0.05
        if known:
            lse[3] = 1.0  # the empty request's row with a finite LSE: still caught
        verdicts = [compare(case, out=out, lse=lse, ref=ref, controls=controls, empty_rows=hint) for hint in (None, known)]
        a, b = verdicts
        assert not a.passed and (a.failures, a.out, a.lse) == (b.failures, b.out, b.lse)
        assert torch.equal(a.error, b.error) and torch.equal(a.lse_error, b.lse_error)
        assert any("empty rows have lse" in f for f in b.failures) == known


def test_a_control_row_whose_logits_overflow_is_never_taken_for_an_empty_one() -> None:
    # q.k = 160000 overflows float16 (finite in float64): the float16 control cannot be computed.
    # A zeroed control row (taken for one with no key) would widen the limit to |ref| and pass an
    # all-zero kernel; whether or not the bucket has a truly empty row (causal qo > kv), no verdict
    import pytest
    from pa_oracle.oracle.case import CaseError

    for qo, kv, causal in ((2, 1, True), (1, 1, False)):
        case = Case(Layout.from_lengths([qo], [kv], 4), Heads(1, 1, 16, 16), Options(q_dtype="float16", kv_dtype="float16", causal=causal))
        tensors = make_tensors(case)
        tensors.q.fill_(100.0)
        tensors.k_cache.fill_(100.0)
        ref = reference(case, tensors, logit_noise=True)
        controls = [plain_attention(case, tensors, torch.float16, reorder_ops=r) for r in (False, True)]
        assert torch.isfinite(ref.out).all()
        with pytest.raises(CaseError, match="overflow"):
            compare(case, out=torch.zeros_like(ref.out, dtype=torch.float16), lse=None, ref=ref, controls=controls)


# --- issue 30: a RoPE case's RoPE controls (oracle/tolerance.py's docstring) -----------------------------------

NO_ROPE = (  # non-RoPE cases of several kinds: their limits must be what they were before the RoPE controls, bit for bit
    CASE,
    Case(Layout.from_lengths([1, 1, 1], [1, 2, 1], 16), Heads(2, 1, 64, 64), Options(q_dtype="bfloat16", kv_dtype="bfloat16"), seed=1,
         distribution="outliers"),
    Case(Layout.from_lengths([1, 4], [9, 30], 8), Heads(4, 1, 16, 16), Options(q_dtype="float16", kv_dtype="float8_e4m3fn", k_scale=0.5,
         v_scale=2.0, causal=True, logits_soft_cap=30.0)),
    Case(Layout.from_lengths([2, 1], [273, 40], 16), Heads(2, 2, 16, 16), Options(window_left=64, sinks=(0.5, -1.0)), seed=3),
)


def test_cases_without_rope_have_no_rope_controls_and_the_limits_they_had() -> None:
    for case in NO_ROPE:
        tensors = make_tensors(case)
        ref = reference(case, tensors, logit_noise=True)
        assert ref.rope_control is None
        dtype = getattr(torch, case.options.out_dtype)
        controls = [plain_attention(case, tensors, dtype, reorder_ops=r) for r in (False, True)]
        out, lse = ref.out.to(dtype), ref.lse.float() + 1e-3
        verdict = compare(case, out=out, lse=lse, ref=ref, controls=controls)
        for stats, kernel, ref_values in ((verdict.out, out, ref.out), (verdict.lse, lse, ref.lse)):
            assert stats.rope_max_error is None and stats.rope_mean_error is None
            assert stats.limit_max == 3.0 * stats.control_max_error + stats.floor  # the formula before issue 30, to the bit
            assert stats.max_error == _definition(kernel, [c[0 if stats.name == "out" else 1] for c in controls], ref_values)[0]


def _rope_reference(case: Case, shift: float, angle: float) -> tuple:  # noqa: ANN201 - (tensors, ref, controls)
    """``case``'s reference with made-up RoPE controls: R = ref + ``shift`` (every element), A = ref + ``angle``."""
    from pa_oracle.oracle.result import RopeControl

    tensors = make_tensors(case)
    ref = reference(case, tensors, logit_noise=True)
    rope = RopeControl(ref.out + shift, ref.lse + shift, ref.out + angle, ref.lse + angle)
    controls = [plain_attention(case, tensors, torch.bfloat16, reorder_ops=r) for r in (False, True)]
    return ref._replace(rope_control=rope), controls


def test_a_rope_case_error_is_the_distance_beyond_the_nearer_of_the_reference_and_the_rope_control() -> None:
    case = Case(Layout.from_lengths([3, 1], [20, 7], 4), Heads(4, 2, 16, 16), Options(q_dtype="bfloat16", kv_dtype="bfloat16"))
    ref, controls = _rope_reference(case, shift=0.25, angle=1e-3)
    judged = lambda lse: compare(case, out=ref.out.to(torch.bfloat16), lse=lse, ref=ref, controls=controls)  # noqa: E731
    for offset, beyond in ((0.0, 0.0), (0.125, 0.0), (0.25, 0.0), (0.3, 0.05), (-0.05, 0.05)):
        verdict = judged((ref.lse + offset).float())
        assert abs(verdict.lse.max_error - beyond) < 1e-5, (offset, verdict.lse)
    stats = verdict.lse
    assert stats.rope_max_error == float((ref.rope_control.angle_lse - ref.lse).abs().max())
    assert stats.limit_max == 3.0 * stats.control_max_error + stats.floor + 1.5 * stats.rope_max_error
    far = judged((ref.lse + 0.25 + 1.01 * stats.limit_max).float())  # just beyond R by more than the limit
    assert not far.passed and "error beyond the RoPE control" in far.headline(), far.headline()
    assert judged((ref.lse + 0.25 + 0.99 * stats.limit_max).float()).passed


def test_the_rope_ratio_is_at_least_one() -> None:
    import pytest
    from pa_oracle.oracle.tolerance import Tolerance

    with pytest.raises(ValueError, match="rope_ratio"):
        Tolerance(rope_ratio=0.5)
