"""Run one case on one backend and judge it: tensors -> (oracle, control, kernel) -> verdict.

A kernel that raises ``Unsupported`` or ``NotImplementedError`` skips the case; any other
exception (or a crash signature in such a message) is a finding, never a skip.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Literal

from backends.base import Backend, KernelOutput, Unsupported
from oracle.case import Case
from oracle.reference import plain_attention, reference
from oracle.tensors import Tensors, make_tensors, torch_dtype
from oracle.tolerance import Tolerance, Verdict, compare

Status = Literal["pass", "fail", "crash", "unsupported"]
_CRASH_SIGNS = ("illegal memory", "device-side assert", "cuda error", "segmentation", "out of bounds")


@dataclass
class Outcome:
    case: Case
    backend: str
    status: Status
    message: str = ""
    verdict: Verdict | None = None

    @property
    def is_finding(self) -> bool:
        return self.status in ("fail", "crash")


def is_unsupported(exc: BaseException) -> bool:
    """FlashInfer's rule: a crash is always a finding; only explicit refusals are skips."""
    if any(sign in str(exc).lower() for sign in _CRASH_SIGNS):
        return False
    return isinstance(exc, (Unsupported, NotImplementedError))


class OracleDisagreement(AssertionError):
    """The fused float64 kernel and the torch reference judged a kernel differently: a bug in the
    oracle itself, never a finding about the kernel."""


def judge(case: Case, tensors: Tensors, result: KernelOutput, tolerance: Tolerance = Tolerance()) -> Verdict:
    """Compare a kernel's output for ``case`` on ``tensors`` with the float64 reference.

    On CUDA the reference is computed by the fused kernel (``oracle.fused``); a failing verdict is
    computed again against the torch reference, the definition, which alone decides a finding.
    """
    ref = reference(case, tensors, logit_noise=True)
    dtype = torch_dtype(case.options.q_dtype)
    controls = [plain_attention(case, tensors, dtype, reorder_ops=r) for r in (False, True)]
    verdict = compare(case, out=result.out, lse=result.lse, ref=ref, controls=controls, tolerance=tolerance)
    if verdict.passed or ref.engine == "torch":
        return verdict
    definition = reference(case, tensors, logit_noise=True, engine="torch")
    again = compare(case, out=result.out, lse=result.lse, ref=definition, controls=controls, tolerance=tolerance)
    if again.passed:
        raise OracleDisagreement(
            f"the fused oracle failed the kernel ({verdict.headline()}) but the torch reference passes it: "
            f"max |fused - torch| out {(ref.out - definition.out).abs().nan_to_num().max().item():.3g}; case {case.summary()}"
        )
    return again


def check_case(backend: Backend, case: Case, tolerance: Tolerance = Tolerance()) -> Outcome:
    """Run ``case`` on ``backend`` and compare with the float64 reference."""
    reason = backend.unsupported_reason(case)
    if reason:
        return Outcome(case, backend.name, "unsupported", reason)
    tensors = make_tensors(case, backend.device or "cpu")
    before = tensors.fingerprint()
    try:
        result = backend.run(backend.plan(case), tensors)
    except Exception as exc:  # noqa: BLE001 - classified below
        if is_unsupported(exc):
            return Outcome(case, backend.name, "unsupported", f"{type(exc).__name__}: {exc}")
        tb = "".join(traceback.format_exception(exc, limit=-4))
        return Outcome(case, backend.name, "crash", f"{type(exc).__name__}: {exc}\n{tb}")
    verdict = judge(case, tensors, result, tolerance)
    changed = [name for name, bits in tensors.fingerprint().items() if bits != before[name]]
    if changed:
        verdict.passed = False
        verdict.failures.append(f"kernel modified its inputs: {', '.join(changed)}")
    return Outcome(case, backend.name, "pass" if verdict.passed else "fail", verdict.headline(), verdict)
