"""The LSE floor of an fp8-q case covers the fp8 tensor-core dot's precision (``fp8_logit_noise``).

On the H200, FlashInfer's fa3 fp8 prefill gave a one-key row an LSE 6.2e-05 from exact while the bf16
control happened to land 2.06e-05 from it (limit 6.17e-05): without the noise term, a 1-element LSE
judged against a control's lucky rounding fails a correct kernel."""

from __future__ import annotations

import torch
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.reference import FP8_DOT_BITS, fp8_logit_noise, plain_controls, reference
from pa_oracle.oracle.tensors import gather_kv, make_tensors, query_values
from pa_oracle.oracle.tolerance import compare

FP8 = dict(q_dtype="float8_e4m3fn", kv_dtype="float8_e4m3fn", o_dtype="bfloat16")
# the H200's case (flashinfer-prefill-fa3-fp8, 2026-12-01): qo 2, kv 1, causal: row 0 has no key, row 1 one
SEEN = Case(Layout((0, 2), (0, 1), (1,), (1,), 16, 4), Heads(1, 1, 128, 128), Options(causal=True, **FP8), seed=0)


def _judge(case: Case, lse_shift: float, noise: bool) -> tuple[bool, str]:
    t = make_tensors(case, "cpu")
    ref = reference(case, t, logit_noise=True, engine="torch")
    controls = plain_controls(case, t, torch.bfloat16)
    lse = ref.lse.clone().float()
    lse[torch.isfinite(lse)] += lse_shift
    out = ref.out.to(torch.bfloat16)
    v = compare(case, out=out, lse=lse, ref=ref, controls=controls, lse_noise=fp8_logit_noise(case, t) if noise else None)
    return v.passed, v.headline()


def test_the_seen_lse_error_passes_with_the_fp8_dot_noise_and_failed_without() -> None:
    assert not _judge(SEEN, 6.2e-05, noise=False)[0]  # the false finding the campaign would have recorded
    assert _judge(SEEN, 6.2e-05, noise=True)[0]


def test_a_wrong_lse_still_fails() -> None:
    passed, headline = _judge(SEEN, 0.05, noise=True)
    assert not passed and "lse max error" in headline


def test_the_bound_covers_every_key_of_a_drawn_case() -> None:
    """2^-bits * sm_scale * sum_i |q_i k_i| (what the dot may lose) <= the bound, for each row and each of its keys."""
    case = Case(Layout.from_lengths([3, 1, 4], [5, 2, 9], 4), Heads(8, 2, 64, 64), Options(**FP8), seed=3)
    t = make_tensors(case, "cpu")
    bound = fp8_logit_noise(case, t)
    keys, _ = gather_kv(case, t, torch.float64)
    q = query_values(case, t, torch.float64)
    lay, g = case.layout, case.heads.group_size
    starts = [0]
    for n in lay.kv_lens:
        starts.append(starts[-1] + n)
    for r in range(lay.batch_size):
        for row in range(lay.qo_indptr[r], lay.qo_indptr[r + 1]):
            for h in range(case.heads.num_qo_heads):
                k = keys[starts[r] : starts[r + 1], h // g]
                loss = (q[row, h].abs() * k.abs()).sum(-1).max() * case.sm_scale * 2.0**-FP8_DOT_BITS
                assert loss <= bound[row, h] * (1 + 1e-12)
