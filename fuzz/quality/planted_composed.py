"""Planted composed kernels (issue 15): the shapes of FlashInfer's POD (prefill and decode requests
in one call) and cascade (a KV prefix and suffix merged), built from ``planted._paged_attention``,
each naming ``planted.correct_attention`` as its parts (``Backend.parts``). The selftest runs them
with the ``composed-vs-parts`` check (``CHECKS``): the planted ones must be caught on CPU, the
correct ones must pass.

- ``pod_swaps_decode_rows``: the decode batch's outputs written back in reverse request order.
- ``cascade_drops_prefix_weight``: the merge gives the prefix state the suffix's weight (its own LSE
  dropped), an equal-weight average wherever the prefix has keys.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pa_oracle.backends.base import Backend, KernelOutput, Part, Unsupported
from pa_oracle.backends.flashinfer_cascade import split_layouts
from pa_oracle.backends.flashinfer_pod import rows_of, split_requests, sub_layout
from pa_oracle.backends.user import capabilities_of
from pa_oracle.fuzz.quality import planted
from pa_oracle.oracle.case import Case, Layout
from pa_oracle.oracle.tensors import Tensors

PART = "pa_oracle.fuzz.quality.planted:correct_attention"


def _attend(case: Case, q: torch.Tensor, tensors: Tensors, layout: dict[str, Any], causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``planted._paged_attention`` of ``q`` over ``layout`` (CSR lists) in the case's pool."""
    device = q.device
    index = {name: torch.tensor(values, dtype=torch.int32, device=device) for name, values in layout.items()}
    opts = case.options
    return planted._paged_attention(
        q, tensors.k_cache, tensors.v_cache, qo_indptr=index["qo_indptr"], kv_indptr=index["kv_indptr"],
        kv_indices=index["kv_indices"], kv_last_page_len=index["kv_last_page_len"], causal=causal, sm_scale=case.sm_scale,
        window_left=opts.window_left, logits_soft_cap=opts.logits_soft_cap,
    )


def _csr(layout: Layout) -> dict[str, Any]:
    return {name: list(getattr(layout, name)) for name in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len")}


class _Planted(Backend):
    bug: ClassVar[str]
    capabilities = capabilities_of(planted.correct_attention)


class _PlantedPod(_Planted):
    """POD's shape: the qo_len 1 requests as one batch, every other request as another."""

    parts = (Part("prefill", PART), Part("decode", PART))

    def run(self, plan: Case, tensors: Tensors) -> KernelOutput:
        case, lay = plan, plan.layout
        prefill, decode = split_requests(lay)
        if not prefill or not decode:
            raise Unsupported("a POD batch needs a decode request (qo_len 1) and a prefill request")
        out = tensors.q.new_zeros(lay.total_q, case.heads.num_qo_heads, case.heads.head_dim_vo)
        lse = torch.full((lay.total_q, case.heads.num_qo_heads), float("-inf"), device=tensors.q.device)
        for requests in (prefill, decode):
            rows = torch.tensor(rows_of(lay, requests), dtype=torch.long, device=tensors.q.device)
            o, s = _attend(case, tensors.q[rows], tensors, sub_layout(lay, requests), case.options.causal)
            if requests is decode and self.bug == "pod_swaps_decode_rows":
                rows = rows.flip(0)
            out[rows], lse[rows] = o, s
        return KernelOutput(out, lse)


class _PlantedCascade(_Planted):
    """The cascade's shape: each request's KV cut at a page boundary before its first query, the
    prefix (non-causal) and suffix states merged."""

    parts = (Part("all", PART),)
    capabilities = _Planted.capabilities.replace(window_left=False)  # the prefix call has no window (as the real cascade)

    def run(self, plan: Case, tensors: Tensors) -> KernelOutput:
        case = plan
        prefix, suffix = split_layouts(case)
        o1, l1 = _attend(case, tensors.q, tensors, _csr(prefix), False)
        o2, l2 = _attend(case, tensors.q, tensors, _csr(suffix), case.options.causal)
        m = torch.maximum(l1, l2)
        m = torch.where(torch.isinf(m), 0.0, m)
        w1, w2 = torch.exp(l1 - m), torch.exp(l2 - m)
        if self.bug == "cascade_drops_prefix_weight":
            w1 = torch.where(torch.isinf(l1), 0.0, w2)
        total = w1 + w2
        safe = torch.where(total == 0, 1.0, total)
        out = (w1[..., None] * o1.float() + w2[..., None] * o2.float()) / safe[..., None]
        lse = torch.where(total == 0, float("-inf"), m + torch.log(safe))
        return KernelOutput(out.to(tensors.q.dtype), lse)


def _named(base: type[_Planted], name: str, bug: str) -> type[_Planted]:
    return type(name, (base,), {"name": name, "bug": bug, "description": BUGS.get(name, "correct")})


BUGS = {
    "pod_swaps_decode_rows": "POD-shaped: the decode batch's rows written back in reverse request order",
    "cascade_drops_prefix_weight": "cascade-shaped: the merge gives the prefix state the suffix's weight (its LSE dropped)",
}
CORRECT = ("correct_pod", "correct_cascade")
PLANTED = tuple(BUGS)
CHECKS = {name: "composed-vs-parts" for name in (*PLANTED, *CORRECT)}

pod_swaps_decode_rows = _named(_PlantedPod, "pod_swaps_decode_rows", "pod_swaps_decode_rows")
cascade_drops_prefix_weight = _named(_PlantedCascade, "cascade_drops_prefix_weight", "cascade_drops_prefix_weight")
correct_pod = _named(_PlantedPod, "correct_pod", "")
correct_cascade = _named(_PlantedCascade, "correct_cascade", "")
