"""Kernels and adapters (CPU, torch) that break one contract beyond output values each: a
metamorphic relation, plan reuse, a stale plan, CUDA-graph replay.
The checks of ``pa_oracle.fuzz.checks.registry`` must catch every one; their correct twins must pass.

They compute with ``pa_oracle.fuzz.quality.planted``'s correct per-request float32 kernel.
"""

from __future__ import annotations

from typing import Any

import torch
from pa_oracle.backends.base import Backend, Capabilities, GraphCall, KernelOutput, RawOutput, Unsupported
from pa_oracle.fuzz.quality.planted import _paged_attention, correct_attention
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import Tensors

_PLAIN = Capabilities(alibi=False, sinks=False, fp8_scales=False)


def ignores_page_table(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
                       window_left, logits_soft_cap):
    """Reads request b's pages as physical pages kv_indptr[b]..kv_indptr[b+1] (an identity page
    table assumed): right on an identity layout, wrong once pages are relabeled."""
    return correct_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                             kv_indices=torch.arange(len(kv_indices), dtype=kv_indices.dtype),
                             kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                             window_left=window_left, logits_soft_cap=logits_soft_cap)


def batch_size_dependent(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
                         window_left, logits_soft_cap):
    """Adds 1e-3 per request in the batch beyond the first (a batch-shaped accumulator)."""
    out, lse = correct_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                                 kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                                 window_left=window_left, logits_soft_cap=logits_soft_cap)
    return out + (len(qo_indptr) - 2) * 1e-3, lse


def correct_with_fp8_scales(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal,
                            sm_scale, window_left, logits_soft_cap, k_scale, v_scale):
    """The correct kernel, also for fp8 KV with scales (the twin the fp8 cases need)."""
    return _paged_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                            kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                            window_left=window_left, logits_soft_cap=logits_soft_cap, k_scale=k_scale, v_scale=v_scale)


def _attend(case: Case, tensors: Tensors, indptr: torch.Tensor, indices: torch.Tensor, last: torch.Tensor) -> KernelOutput:
    opts = case.options
    out, lse = _paged_attention(
        tensors.q, tensors.k_cache, tensors.v_cache, qo_indptr=torch.tensor(case.layout.qo_indptr), kv_indptr=indptr,
        kv_indices=indices, kv_last_page_len=last, causal=opts.causal, sm_scale=case.sm_scale,
        window_left=opts.window_left, logits_soft_cap=opts.logits_soft_cap,
    )
    return KernelOutput(out, lse)


class LayoutBuffersKernel(Backend):
    """FlashInfer's shape of plan: device buffers for the page table (read at run time) plus a
    host-side schedule made at plan time. ``planned_lengths=True`` takes each request's kv length
    from that schedule (a plan that must be redone when lengths change); False reads everything
    from the buffers at run time (no plan to go stale)."""

    capabilities = _PLAIN

    def __init__(self, *, planned_lengths: bool) -> None:
        self.planned_lengths = planned_lengths
        self.name = "planned-lengths" if planned_lengths else "run-time-layout"

    def plan(self, case: Case) -> dict[str, Any]:
        lay = case.layout
        return {
            "case": case,
            "kv_indptr": torch.tensor(lay.kv_indptr, dtype=torch.int32),
            "kv_indices": torch.tensor(lay.kv_indices, dtype=torch.int32),
            "kv_last_page_len": torch.tensor(lay.kv_last_page_len, dtype=torch.int32),
            "planned_last_page_len": torch.tensor(lay.kv_last_page_len, dtype=torch.int32),
        }

    def write_layout(self, plan: dict[str, Any], case: Case) -> None:
        for name in ("kv_indptr", "kv_indices", "kv_last_page_len"):
            values = torch.tensor(getattr(case.layout, name), dtype=torch.int32)
            if values.shape != plan[name].shape:
                raise Unsupported(f"{name} of {tuple(values.shape)} does not fit the planned {tuple(plan[name].shape)}")
            plan[name].copy_(values)

    def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
        last = plan["planned_last_page_len"] if self.planned_lengths else plan["kv_last_page_len"]
        return _attend(plan["case"], tensors, plan["kv_indptr"], plan["kv_indices"], last)


class CachingPlanKernel(Backend):
    """Gathers K and V at the first run and keeps them in the plan: later runs on new data reuse them."""

    name = "caching-plan"
    capabilities = _PLAIN

    def plan(self, case: Case) -> dict[str, Any]:
        return {"case": case}

    def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
        if "kv" not in plan:
            plan["kv"] = (tensors.k_cache.clone(), tensors.v_cache.clone())
        case, lay = plan["case"], plan["case"].layout
        cached = Tensors(tensors.q, *plan["kv"])
        index = lambda xs: torch.tensor(xs, dtype=torch.int32)
        return _attend(case, cached, index(lay.kv_indptr), index(lay.kv_indices), index(lay.kv_last_page_len))


class FakeGraphKernel(Backend):
    """The CUDA-graph contract on CPU: static buffers, a "replay" that re-runs the call on them.
    ``bug``: ``"nan_padding"`` writes NaN into the padding requests' rows on replay;
    ``"stale_capture"`` replays on the inputs as they were at capture time (a copy, not the
    static buffers); ``""`` is correct."""

    capabilities = _PLAIN
    cuda_graphs = True

    def __init__(self, bug: str = "") -> None:
        self.bug = bug
        self.name = f"fake-graph{'-' + bug if bug else ''}"

    def run(self, plan: Case, tensors: Tensors) -> KernelOutput:
        index = lambda xs: torch.tensor(xs, dtype=torch.int32)
        lay = plan.layout
        return _attend(plan, tensors, index(lay.kv_indptr), index(lay.kv_indices), index(lay.kv_last_page_len))

    def capture_graph(self, case: Case, tensors: Tensors) -> GraphCall:
        static = Tensors(tensors.q.clone(), tensors.k_cache.clone(), tensors.v_cache.clone())
        captured = Tensors(tensors.q.clone(), tensors.k_cache.clone(), tensors.v_cache.clone())
        out = torch.empty(case.layout.total_q, case.heads.num_qo_heads, case.heads.head_dim_vo, dtype=tensors.q.dtype)
        lse = torch.empty(case.layout.total_q, case.heads.num_qo_heads)

        def load(new: Tensors) -> None:
            for target, source in zip((static.q, static.k_cache, static.v_cache), (new.q, new.k_cache, new.v_cache)):
                target.copy_(source)

        def launch(inputs: Tensors = static) -> RawOutput:
            result = self.run(case, inputs)
            out.copy_(result.out)
            lse.copy_(result.lse)
            return out, lse

        def replay() -> None:
            launch(captured if self.bug == "stale_capture" else static)
            if self.bug == "nan_padding":
                out[case.layout.qo_indptr[-2] :] = float("nan")

        return GraphCall(load=load, launch=launch, replay=replay, outputs=(out, lse), rows=lambda raw: raw,
                         finish=lambda raw: KernelOutput(raw[0].clone(), raw[1].clone()))
