from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pa_oracle.backends import get_backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.checks.masks import MASK_CHECKS, attended, visible_keys, with_other_mask
from pa_oracle.fuzz.checks.registry import CHECKS
from pa_oracle.fuzz.quality import planted_families
from pa_oracle.oracle.case import Case, CustomMask, Heads, Layout, Options

from tests.fake_kernels import _module, attend

CHECK = MASK_CHECKS[0]
LAYOUT = Layout.from_lengths([4, 3], [9, 5], 4)
PLAIN = Case(LAYOUT, Heads(4, 2, 8, 8), Options(causal=True), seed=5)


def test_the_check_is_registered_and_draws_unmasked_cases_for_a_kernel_that_takes_both() -> None:
    assert CHECKS["mask-replan"] is CHECK
    stale = UserKernel(planted_families.stale_mask_on_replan)
    assert stale.capabilities.custom_mask == (False, True)
    assert CHECK.capabilities(stale).custom_mask == (False,)
    assert "no custom mask" in CHECK.capabilities(get_backend("sdpa-math"))
    assert CHECK.capabilities(get_backend("flashinfer-prefill-mask")).custom_mask == (True,)  # masks only: mask -> mask


@pytest.mark.parametrize("case", [PLAIN, PLAIN.replace(options=Options(causal=False, window_left=2)),
                                  PLAIN.replace(custom_mask=CustomMask(tree_parents=((-1, 0, 0, 1), (-1, 0, 1))))],
                         ids=["causal", "window", "tree"])
def test_the_other_mask_hides_a_seen_key_keeps_every_row_and_replays(case: Case) -> None:
    other = with_other_mask(case)
    assert other.layout == case.layout and other.seed == case.seed and other.custom_mask != case.custom_mask
    before, after = attended(case), attended(other)
    assert any(not np.array_equal(a, b) for a, b in zip(after, before))
    for seen, keep in zip(visible_keys(case), after):
        assert (keep.any(axis=1) == seen.any(axis=1)).all()  # no row left without a key it could see
    assert with_other_mask(case).custom_mask == other.custom_mask


def test_a_layout_where_every_row_sees_one_key_has_no_other_mask() -> None:
    decode = Case(Layout.from_lengths([1, 1], [1, 1], 4), Heads(2, 1, 8, 8), Options(causal=True))
    outcome = CHECK(UserKernel(planted_families.correct_replanned_mask), decode)
    assert outcome.status == "unsupported" and "one key at most" in outcome.message


def test_the_planted_stale_mask_is_caught_and_the_correct_stateful_kernel_passes() -> None:
    planted_families._last_mask.clear()
    stale = CHECK(UserKernel(planted_families.stale_mask_on_replan), PLAIN)
    assert stale.status == "fail" and stale.message.startswith("stale mask:"), stale.message
    assert [label for label, _, _ in stale.cases] == ["original", "other-mask"]
    correct = CHECK(UserKernel(planted_families.correct_replanned_mask), PLAIN)
    assert correct.status == "pass", correct.message
    again = CHECK(UserKernel(planted_families.correct_replanned_mask), PLAIN)  # its kept state does not leak either
    assert again.status == "pass", again.message


class _FakeRaggedWrapper:
    """``BatchPrefillWithRaggedKVCacheWrapper`` as 0.6.18's source reads: ``plan`` sets the mask
    buffer only when given a mask (``clears``: the paged wrapper's ``else: None``), and ``run``
    applies the buffer whenever it is set (``MaskMode.CUSTOM``), else causal or not."""

    clears = False

    def __init__(self, workspace, kv_layout="NHD", backend="auto"):
        self._custom_mask_buf = None

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, *, custom_mask=None, causal=False,
             pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, sm_scale=None, q_data_type=None,
             kv_data_type=None):
        assert pos_encoding_mode == "NONE" and not logits_soft_cap
        self.qo, self.kv = qo_indptr.tolist(), kv_indptr.tolist()
        self.causal, self.window_left, self.scale = causal, window_left, sm_scale
        if custom_mask is not None:
            self._custom_mask_buf = custom_mask.clone()
        elif self.clears:
            self._custom_mask_buf = None

    def run(self, q, k, v, return_lse=False):
        out = torch.empty(*q.shape[:2], v.shape[-1], dtype=q.dtype)
        lse = torch.empty(q.shape[:2], dtype=torch.float32)
        offset = 0
        for b in range(len(self.qo) - 1):
            rows, keys = slice(self.qo[b], self.qo[b + 1]), slice(self.kv[b], self.kv[b + 1])
            qo_len, kv_len = rows.stop - rows.start, keys.stop - keys.start
            q_pos, k_pos = torch.arange(kv_len - qo_len, kv_len)[:, None], torch.arange(kv_len)[None, :]
            if self._custom_mask_buf is not None:
                keep = self._custom_mask_buf[offset : offset + qo_len * kv_len].view(qo_len, kv_len).bool()
            else:
                keep = (k_pos <= q_pos) if self.causal else torch.ones(qo_len, kv_len, dtype=torch.bool)
            if self.window_left >= 0:
                keep = keep & (k_pos >= q_pos - self.window_left)
            offset += qo_len * kv_len
            o, lse_e = attend(q[rows], k[keys], v[keys], keep, scale=self.scale)
            out[rows], lse[rows] = o.to(out.dtype), (lse_e / math.log(2.0)).float()
        return out, lse


class _FakeFixedWrapper(_FakeRaggedWrapper):
    clears = True


@pytest.mark.parametrize("wrapper, stale", [(_FakeRaggedWrapper, True), (_FakeFixedWrapper, False)], ids=["keeps-mask", "clears-mask"])
def test_flashinfer_ragged_mask_replans_one_wrapper_and_the_check_sees_a_kept_mask(
    wrapper: type, stale: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "flashinfer", _module("flashinfer", BatchPrefillWithRaggedKVCacheWrapper=wrapper))
    backend = get_backend("flashinfer-ragged-mask")
    monkeypatch.setattr(type(backend), "device", property(lambda self: "cpu"))
    case = PLAIN.replace(heads=Heads(4, 2, 64, 64), options=Options(causal=True, q_dtype="float16", kv_dtype="float16"))
    outcome = CHECK(backend, case)
    if stale:
        assert outcome.status == "fail" and "stale mask" in outcome.message and "one plan, re-planned" in outcome.message
    else:
        assert outcome.status == "pass", outcome.message
