"""Kernels that break under the gate (tests/gates/test_kernel_failures.py): one raises, one returns the wrong shape."""

from __future__ import annotations


def raises_in_the_model(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,  # type: ignore[no-untyped-def]
                        causal, sm_scale, window_left, logits_soft_cap):
    raise ValueError("an index out of range in my kernel")


def returns_one_row(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,  # type: ignore[no-untyped-def]
                    causal, sm_scale, window_left, logits_soft_cap):
    return q[:1].clone()
