"""The SGLang extend mask adapter hands the kernel exactly the keys the oracle attends: a model of
how 0.5.10.post1's ``_fwd_kernel`` reads ``custom_mask`` (``extend_attention.py``) applied to what
the adapter builds must give the oracle's attended keys, for drawn tree and arbitrary masks."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from pa_oracle.backends.sglang_extend_mask import SglangExtendMask, attended_masks, sglang_mask
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.oracle.case import Case, CustomMask, Heads, Layout, Options


def kernel_visible(flat: np.ndarray, indptr: list[int], skip_prefix: bool, qo_lens: tuple[int, ...], kv_lens: tuple[int, ...]) -> list[np.ndarray]:
    """What the kernel attends with ``is_causal=False`` and no window: prefix keys from the mask at
    ``mask_indptr[b] + row * seq_len + n`` unless ``skip_prefix_custom_mask``, extend keys at
    ``... + prefix_len + n`` (seq_len = prefix + extend)."""
    out = []
    for b, (qo, kv) in enumerate(zip(qo_lens, kv_lens)):
        prefix, keep = kv - qo, np.zeros((qo, kv), dtype=bool)
        for row in range(qo):
            base = indptr[b] + row * kv
            keep[row, :prefix] = True if skip_prefix else flat[base : base + prefix]
            keep[row, prefix:] = flat[base + prefix : base + kv]
        out.append(keep)
    return out


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and (x == y).all() for x, y in zip(a, b))


@settings(max_examples=120, database=None, suppress_health_check=list(HealthCheck), deadline=None)
@given(cases(SglangExtendMask.capabilities, Limits(max_batch=3)))
def test_the_kernel_reads_back_the_keys_the_oracle_attends(case: Case) -> None:
    flat, indptr, skip = sglang_mask(case)
    assert indptr[-1] == flat.size
    assert _same(kernel_visible(flat, indptr, skip, case.layout.qo_lens, case.layout.kv_lens), attended_masks(case))


def test_a_tree_behind_its_prefix_takes_sglangs_default_skip_and_a_window_does_not() -> None:
    tree = CustomMask(tree_parents=((-1, 0, 0),))
    causal = Case(Layout.from_lengths([3], [40], 16), Heads(2, 1, 64, 64), Options(causal=True), custom_mask=tree)
    assert sglang_mask(causal)[2] is True
    windowed = causal.replace(options=Options(causal=True, window_left=4))
    flat, indptr, skip = sglang_mask(windowed)
    assert skip is False and not flat.reshape(3, 40)[:, :30].any()  # the window hides the old prefix


def test_a_mask_row_without_keys_is_skipped_not_judged() -> None:
    bits = CustomMask.from_dense([np.array([[True, False], [False, False]])])
    case = Case(Layout.from_lengths([2], [2], 16), Heads(1, 1, 64, 64), Options(causal=False, q_dtype="bfloat16", kv_dtype="bfloat16"), custom_mask=bits)
    reason = SglangExtendMask.unsupported_reason(SglangExtendMask.__new__(SglangExtendMask), case)
    assert reason is not None and "no key" in reason
