from __future__ import annotations

import torch
from pa_oracle.backends import get_backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.checks.properties import measure
from pa_oracle.fuzz.quality import planted
from pa_oracle.oracle.case import Case, Heads, Layout, Options

CASE = Case(Layout.from_lengths([1, 5, 3], [40, 9, 3], 4, extra_pages=2), Heads(4, 2, 16, 16), Options(causal=True))


def test_a_per_request_kernel_is_deterministic_and_batch_invariant() -> None:
    props = measure(UserKernel(planted.correct_attention), CASE)
    assert props.deterministic and props.batch_invariant


def test_a_kernel_whose_rows_depend_on_the_batch_is_not_batch_invariant() -> None:
    def batch_dependent(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale, window_left, logits_soft_cap):
        out, lse = planted.correct_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                                             kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                                             window_left=window_left, logits_soft_cap=logits_soft_cap)
        return out + (len(qo_indptr) - 2) * 1e-3 * torch.ones_like(out), lse  # depends on the batch size

    props = measure(UserKernel(batch_dependent), CASE)
    assert props.deterministic and props.batch_invariant is False


def test_sdpa_math_on_cpu_is_deterministic() -> None:
    assert measure(get_backend("sdpa-math"), CASE).deterministic
