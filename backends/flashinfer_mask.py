"""FlashInfer paged prefill with a custom mask (``plan(packed_custom_mask=...)``), the path of
speculative decoding's draft trees, and the same wrapper planned again without one.

FlashInfer's custom mask replaces causal (``causal`` only acts without a mask), so the adapter
ANDs the case's causal test into the mask, as the oracle defines; the window is passed as
``window_left`` (FlashInfer's kernel applies it on top of the mask, ``variants.cuh``).

Two ways in: ``flashinfer-prefill-mask`` passes ``custom_mask`` (the flat boolean mask, what
serving engines pass; ``plan`` packs it with ``segment_packbits``, per request, and keeps the byte
offsets). ``flashinfer-prefill-packed-mask`` passes ``packed_custom_mask`` as the docstring says
to make it (``flashinfer.quantization.packbits`` of the flat mask, little-endian). Read from
0.6.18's ``plan``: with ``packed_custom_mask`` it keeps ``mask_indptr`` in *elements*
(``_compute_page_mask_indptr``) while the kernel adds it to the byte pointer, so a batch of more
than one request reads other bytes: that adapter is expected to fail there (a lead to confirm on
the GPU, not yet a confirmed finding).

``flashinfer-prefill-mask-replan`` checks plan reuse (FlashInfer PR #1028): one wrapper is first
planned and run with a stale mask (the complement of the case's, or a random one for a case
without a mask), then planned for the case itself; a wrapper that keeps the stale mask when the
case switches back to causal attention fails.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from pa_oracle.backends.base import register
from pa_oracle.backends.flashinfer import _FLASHINFER, FlashInferPrefillFA2, _workspace
from pa_oracle.oracle.case import Case


def effective_masks(case: Case) -> list[np.ndarray]:
    """Per request the case's mask AND its causal test (FlashInfer's mask replaces causal)."""
    masks = case.masks()
    assert masks is not None
    if not case.options.causal:
        return masks
    out = []
    for m in masks:
        qo, kv = m.shape
        q_pos = np.arange(kv - qo, kv)[:, None]
        out.append(m & (np.arange(kv)[None, :] <= q_pos))
    return out


@register
class FlashInferPrefillMask(FlashInferPrefillFA2):
    name = "flashinfer-prefill-mask"
    description = "FlashInfer BatchPrefillWithPagedKVCacheWrapper(backend='fa2') with packed_custom_mask"
    capabilities = _FLASHINFER.replace(custom_mask=(True,), alibi=False, empty_requests=False)
    cuda_graphs = False

    packed: ClassVar[bool] = False  # True: ``packed_custom_mask`` (packbits of the flat mask); False: ``custom_mask``

    def _mask_kwargs(self, masks: list[np.ndarray] | None, device: str) -> dict[str, Any]:
        if masks is None:
            return {}
        flat = np.concatenate([m.reshape(-1) for m in masks])
        if self.packed:
            return {"packed_custom_mask": torch.from_numpy(np.packbits(flat, bitorder="little")).to(device)}
        return {"custom_mask": torch.from_numpy(flat).to(device)}

    def _planned(self, wrapper: Any, case: Case, device: str, masks: list[np.ndarray] | None = None) -> Any:
        lay = case.layout
        if masks is None and case.custom_mask is not None:
            masks = effective_masks(case)
        wrapper.plan(
            self._index(lay.qo_indptr, device), self._index(lay.kv_indptr, device),
            self._index(lay.kv_indices, device), self._index(lay.kv_last_page_len, device),
            case.heads.num_qo_heads, case.heads.num_kv_heads, case.heads.head_dim_qk, lay.page_size,
            causal=case.options.causal and masks is None, **self._mask_kwargs(masks, device),
            **self._common_plan_kwargs(case),
        )
        return wrapper

    def write_layout(self, plan: Any, case: Case) -> None:
        raise NotImplementedError(f"{self.name}: the mask is planned with the layout; a new layout needs a new plan")


@register
class FlashInferPrefillPackedMask(FlashInferPrefillMask):
    name = "flashinfer-prefill-packed-mask"
    description = "FlashInfer BatchPrefillWithPagedKVCacheWrapper(backend='fa2') with packed_custom_mask (packbits)"
    packed = True


@register
class FlashInferPrefillMaskReplan(FlashInferPrefillMask):
    name = "flashinfer-prefill-mask-replan"
    description = "FlashInfer paged prefill: one wrapper planned with a stale mask, run, then planned for the case"
    capabilities = FlashInferPrefillMask.capabilities.replace(custom_mask=(False, True))

    def plan(self, case: Case) -> tuple[Case, Any]:
        import flashinfer

        device = self.device or "cuda"
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_workspace(device), self.kv_layout, backend=self.backend)
        rng = np.random.default_rng(case.seed)
        stale = [~m for m in effective_masks(case)] if case.custom_mask is not None else [
            rng.random((q, k)) < 0.5 for q, k in zip(case.layout.qo_lens, case.layout.kv_lens)
        ]
        self._planned(wrapper, case, device, masks=stale)  # run once with it in ``run``, which has the tensors
        return case, wrapper

    def run(self, plan: tuple[Case, Any], tensors: Any) -> Any:
        case, wrapper = plan
        wrapper.run(tensors.q, self._paged_kv(tensors), **self._scales(case))
        self._planned(wrapper, case, self.device or "cuda")  # the case's own plan: its mask, or causal
        return super().run(plan, tensors)
