"""SGLang's Triton extend kernel with a custom mask (``extend_attention_fwd(custom_mask=, mask_indptr=)``),
the path of SGLang's speculative decoding (EAGLE draft-tree verification).

Read from 0.5.10.post1's ``triton_ops/extend_attention.py``: request ``b``'s mask is its
``[qo_len, kv_len]`` boolean matrix (rows the extend tokens, columns prefix then extend keys) flattened
row-major at ``custom_mask[mask_indptr[b]:]``. With a mask, the kernel's causal test is off for the
extend part (``if USE_CUSTOM_MASK ... elif IS_CAUSAL``) while ``is_causal`` still bounds the keys each
block loads, and ``skip_prefix_custom_mask`` (default True) ignores the mask over the prefix. So the
adapter hands over the keys the oracle attends, the case's mask AND its causal and window tests
(bottom-right), with ``is_causal=False`` and ``sliding_window_size=-1``, and skips the prefix part of
the mask (SGLang's default) exactly when every row sees the whole prefix (a draft tree behind its
prefix), else passes ``skip_prefix_custom_mask=False``. A mask row with no key at all (``acc / deno``
is 0 / 0 there) is outside what SGLang builds (a tree node always sees itself): such cases are skipped.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pa_oracle.backends.base import Backend, register
from pa_oracle.backends.sglang_extend import SglangExtend
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.visibility import attended


def attended_masks(case: Case) -> list[np.ndarray]:
    """Per request the ``[qo_len, kv_len]`` keys the oracle attends: the case's mask AND causal AND window."""
    assert case.custom_mask is not None, "a mask adapter runs mask cases only"
    return attended(case)


def sglang_mask(case: Case) -> tuple[np.ndarray, list[int], bool]:
    """(flat boolean mask, mask_indptr, skip_prefix_custom_mask) as SGLang's extend kernel reads them."""
    masks = attended_masks(case)
    indptr = [0]
    for m in masks:
        indptr.append(indptr[-1] + m.size)
    skip_prefix = all(m[:, : m.shape[1] - m.shape[0]].all() for m in masks)
    flat = np.concatenate([m.reshape(-1) for m in masks]) if masks else np.zeros(0, dtype=bool)
    return flat, indptr, skip_prefix


@register
class SglangExtendMask(SglangExtend):
    name = "sglang-extend-mask"
    description = "SGLang Triton extend_attention_fwd with custom_mask / mask_indptr (draft-tree verification)"
    capabilities = SglangExtend.capabilities.replace(custom_mask=(True,))
    # the window and causal tests go into the mask (``is_causal=False``, ``sliding_window_size=-1``): not compiled in
    compile_fields = ("q_dtype", "kv_dtype", "head_dim_qk", "head_dim_vo", "logits_soft_cap", "sinks")

    def __init__(self) -> None:
        super().__init__()
        self.capabilities = self.capabilities.replace(custom_mask=(True,))

    def unsupported_reason(self, case: Case) -> str | None:
        # the window goes into the mask (``sliding_window_size=-1``), so window_left 0 runs too
        reason = Backend.unsupported_reason(self, case)
        if reason is None and case.custom_mask is not None and any(
            m.shape[1] and not m.any(axis=1).all() for m in attended_masks(case) if m.shape[0]
        ):
            return "unsupported: a mask row with no key (SGLang's extend divides by the row's sum; its trees never build one)"
        return reason

    def plan(self, case: Case) -> dict[str, Any]:
        plan = super().plan(case)
        device = self.device or "cuda"
        flat, indptr, skip_prefix = sglang_mask(case)
        plan.update(
            custom_mask=torch.from_numpy(flat).to(device), mask_indptr=torch.tensor(indptr, dtype=torch.int64, device=device),
            skip_prefix_custom_mask=skip_prefix,
        )
        return plan

    def call_source(self, case: Case) -> str | None:
        return None  # the standalone repro's call passes no mask

    def extra_arguments(self, plan: dict[str, Any]) -> dict[str, Any]:
        return {
            "custom_mask": plan["custom_mask"], "mask_indptr": plan["mask_indptr"], "is_causal": False,
            "sliding_window_size": -1, "skip_prefix_custom_mask": plan["skip_prefix_custom_mask"],
        }
