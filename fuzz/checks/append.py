"""Judge one write: canary-filled pool, the kernel's append in place, byte-for-byte comparison
with ``pa_oracle.oracle.append.expected_pools``; the append tensors and index tensors must come
back unchanged."""

from __future__ import annotations

from typing import NamedTuple

from pa_oracle.backends.base import exception_text
from pa_oracle.backends.writes import WriteKernel
from pa_oracle.oracle.append import AppendCase, AppendVerdict, compare_pools, make_inputs
from pa_oracle.oracle.tensors import same_bits


class WriteOutcome(NamedTuple):
    case: AppendCase
    kernel: str
    status: str  # "pass", "fail" (wrong bytes), "crash" (the kernel raised), "mutated" (changed its inputs)
    detail: str
    verdict: AppendVerdict | None = None

    @property
    def ok(self) -> bool:
        return self.status == "pass"


def judge_write(case: AppendCase, kernel: WriteKernel) -> WriteOutcome:
    inputs = make_inputs(case, kernel.device())
    before = inputs._replace(k_pool=inputs.k_pool.clone(), v_pool=inputs.v_pool.clone())
    read_only = {name: getattr(inputs, name).clone() for name in
                 ("append_k", "append_v", "kv_indices", "kv_indptr", "kv_last_page_len", "batch_indices", "positions",
                  "slot_mapping")}
    try:
        kernel.append(case, inputs)
        if inputs.k_pool.is_cuda:
            import torch

            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - whatever the kernel raises is its finding
        return WriteOutcome(case, kernel.name, "crash", f"{type(exc).__name__}: {exception_text(exc)}")
    changed = [name for name, kept in read_only.items() if not same_bits(kept, getattr(inputs, name))]
    if changed:
        return WriteOutcome(case, kernel.name, "mutated", f"the kernel changed its inputs: {', '.join(changed)}")
    verdict = compare_pools(case, before, inputs.k_pool, inputs.v_pool)
    return WriteOutcome(case, kernel.name, "pass" if verdict.ok else "fail", verdict.summary(), verdict)

