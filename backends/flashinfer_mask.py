"""FlashInfer paged prefill with a custom mask (``plan(custom_mask=...)``), the path of
speculative decoding's draft trees, the same wrapper planned again without one, and the ragged
wrapper with a mask.

FlashInfer's custom mask replaces causal (``causal`` only acts without a mask), so the adapter
ANDs the case's causal test into the mask, as the oracle defines; the window is passed as
``window_left`` (FlashInfer's kernel applies it on top of the mask, ``variants.cuh``).

The mask layout (FlashInfer docs, ``tutorials/kv_layout.rst`` "Mask Layout"): each request's
``[qo_len, kv_len]`` mask flattened row-major, requests concatenated (``mask_indptr[1:] =
cumsum(qo_len * kv_len)``, in elements), optionally packed little-endian with ``packbits``.
The kernel (``variants.cuh``, ``LogitsMask``) reads request ``b``'s bit ``q * kv_len + k`` at
``custom_mask + mask_indptr[b]`` as a *byte* pointer, so the indptr it is given must count
bytes of per-request byte-aligned segments: what ``plan`` makes from a boolean ``custom_mask``
(``segment_packbits``, which returns byte offsets).

Three ways in: ``flashinfer-prefill-mask`` passes ``custom_mask`` (the flat boolean mask, what
serving engines pass). ``flashinfer-prefill-packed-mask`` passes ``packed_custom_mask`` as the
``plan`` docstring says to make it (``packbits`` of the whole flat mask, ``documented_packed_mask``).
0.6.18's ``plan`` then keeps ``mask_indptr`` in *elements* (``_compute_page_mask_indptr``) and
the kernel adds it to the byte pointer, so any request after the first reads other bytes: that
adapter is expected to fail on batches of more than one request with a mask (open upstream:
flashinfer PR #2201, "mask_indptr should be 8-aligned and converted"). ``flashinfer-ragged-mask``
is the ragged wrapper with ``custom_mask``.

Plan reuse (FlashInfer PR #1028; issue #860, PR #2690 for the ragged wrapper): the mask adapters
re-plan one wrapper (``replan``) for the ``mask-replan`` check (``pa_oracle.fuzz.checks.masks``),
which runs a layout with a mask and without. ``flashinfer-prefill-mask-replan`` does the same
inside one oracle comparison: one wrapper is first planned and run with a stale mask (the
complement of the case's, or a random one for a case without a mask), then planned for the case.
Read from 0.6.18: the paged wrapper's ``plan`` clears ``_custom_mask_buf`` when no mask is given
(outside CUDA-graph mode); the ragged wrapper's ``plan`` does not, and ``run`` picks
``MaskMode.CUSTOM`` whenever that buffer is set: a stale mask after a switch back to causal.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from pa_oracle.backends.base import register
from pa_oracle.backends.flashinfer import _FLASHINFER, FlashInferPrefillFA2, FlashInferRaggedFA2, _workspace
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


def flat_mask(masks: list[np.ndarray]) -> np.ndarray:
    """``custom_mask`` as the docs lay it out: each request's mask row-major, requests concatenated."""
    return np.concatenate([np.asarray(m, dtype=bool).reshape(-1) for m in masks] or [np.zeros(0, bool)])


def documented_packed_mask(masks: list[np.ndarray]) -> np.ndarray:
    """``packed_custom_mask`` as the ``plan`` docstring says to make it: ``packbits`` of the whole
    flat mask, little-endian (bit ``t`` is bit ``t % 8`` of byte ``t // 8``; no per-request padding)."""
    return np.packbits(flat_mask(masks), bitorder="little")


def element_mask_indptr(masks: list[np.ndarray]) -> np.ndarray:
    """The ``mask_indptr`` 0.6.18's ``plan`` computes with ``packed_custom_mask``: ``cumsum(qo_len * kv_len)``, in elements."""
    return np.cumsum([0, *(m.size for m in masks)]).astype(np.int32)


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
        if self.packed:
            return {"packed_custom_mask": torch.from_numpy(documented_packed_mask(masks)).to(device)}
        return {"custom_mask": torch.from_numpy(flat_mask(masks)).to(device)}

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

    def replan(self, plan: tuple[Case, Any], case: Case) -> tuple[Case, Any]:
        """Plan the same wrapper again for ``case`` (its mask, or none), as an engine does between steps."""
        _, wrapper = plan
        return case, self._planned(wrapper, case, self.device or "cuda")

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


@register
class FlashInferRaggedMask(FlashInferRaggedFA2):
    name = "flashinfer-ragged-mask"
    description = "FlashInfer BatchPrefillWithRaggedKVCacheWrapper(backend='fa2') with custom_mask, re-plannable"
    capabilities = FlashInferRaggedFA2.capabilities.replace(custom_mask=(False, True), alibi=False, empty_requests=False)

    def plan(self, case: Case) -> tuple[Case, Any]:
        import flashinfer

        device = self.device or "cuda"
        wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(_workspace(device), "NHD", backend=self.backend)
        return case, self._planned(wrapper, case, device)

    def replan(self, plan: tuple[Case, Any], case: Case) -> tuple[Case, Any]:
        """Plan the same wrapper again for ``case`` (its mask, or none)."""
        _, wrapper = plan
        return case, self._planned(wrapper, case, self.device or "cuda")

    def _planned(self, wrapper: Any, case: Case, device: str) -> Any:
        lay = case.layout
        kv_indptr = np.cumsum([0, *lay.kv_lens]).tolist()
        masks = effective_masks(case) if case.custom_mask is not None else None
        mask = {} if masks is None else {"custom_mask": torch.from_numpy(flat_mask(masks)).to(device)}
        wrapper.plan(
            self._index(lay.qo_indptr, device), self._index(kv_indptr, device),
            case.heads.num_qo_heads, case.heads.num_kv_heads, case.heads.head_dim_qk,
            causal=case.options.causal and masks is None, **mask, **self._common_plan_kwargs(case),
        )
        return wrapper
