"""Checks on kernels beyond output values: a check runs a kernel on a case and on cases derived
from it (or under another calling contract: a reused plan, a CUDA graph) and compares.

Verification model. A relation a kernel should keep bit for bit is judged on bits. One where a
correct kernel may round differently (another batch, other tiles, a merge) is judged against
``allowed_difference``: twice the oracle's allowed error of the case, since two outputs that each
pass the oracle differ by at most that (triangle inequality); whether the bits matched anyway is
reported. Plan and graph checks judge each output against the oracle itself.

EXTENDING: a check is a ``Check`` (name, expectation and why, which cases it draws, the function
that runs it) listed in ``pa_oracle.fuzz.checks.registry.CHECKS``; its function returns an
``Outcome`` (``check_outcome``) whose ``cases`` (original first) are what a finding saves. Any
check runs in the one campaign engine (``pa_oracle.fuzz.campaign.engine``), the oracle comparison
(``pa_oracle.fuzz.run.runner.ORACLE``) being one of them.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Sequence, Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pa_oracle.backends.base import Backend, Capabilities, KernelOutput, Unsupported
from pa_oracle.fuzz.run import boundary
from pa_oracle.fuzz.run.runner import (
    CONTRACT,
    WATCH,
    OracleDisagreement,
    Outcome,
    Status,
    call_kernel,
    describe_exception,
    is_unsupported,
    judge,
)
from pa_oracle.oracle.case import Case, CaseError
from pa_oracle.oracle.report import Location, locate
from pa_oracle.oracle.tensors import Tensors, make_tensors, same_bits, torch_dtype
from pa_oracle.oracle.tolerance import Tolerance

Expectation = Literal["bit-exact", "tolerance", "oracle"]


def check_outcome(
    check: str, backend: str, status: Status, message: str, cases: Sequence[tuple[str, Case, Tensors | None]],
    exact: bool | None = None, worst: Location | None = None, output: KernelOutput | None = None,
) -> Outcome:
    """The outcome of a check beyond the oracle: "pass" (the check held), "fail" (violated),
    "crash" or "unsupported" (skipped); ``cases[0]`` is the original case."""
    return Outcome(cases[0][1], backend, status, message, output=output, check=check, cases=list(cases), exact=exact, worst=worst)


def _declared(backend: Backend) -> Capabilities | str:
    return backend.capabilities


@dataclass(frozen=True)
class Check:
    """A named check: what it expects (and why), which cases it can draw, how it runs."""

    name: str
    expect: Expectation
    why: str
    body: Callable[[Backend, Case, Tolerance], Outcome]
    prepare: Callable[[Backend], Capabilities | str] = _declared

    def capabilities(self, backend: Backend) -> Capabilities | str:
        """What to draw for ``backend``, or why the check cannot apply to it. Derived cases do not
        carry a custom mask along (a reordered or cut layout would keep the old requests' masks):
        the checks draw unmasked cases only."""
        caps = self.prepare(backend)
        if isinstance(caps, Capabilities) and True in caps.custom_mask:
            if False not in caps.custom_mask:
                return "the checks do not carry custom masks into derived cases, and this kernel takes masked cases only"
            caps = caps.replace(custom_mask=(False,))
        return caps

    def judge(self, case: Case, backend: Backend, tolerance: Tolerance = Tolerance(), keep_output: bool = False) -> Outcome:
        """Run the check; an explicit refusal skips it, anything else the kernel raises (any
        ``BaseException`` but the user's Ctrl-C) is a crash finding. The kernel's calls get copies of the
        case and tensors (``run_supported``); what they changed of the judge's code or torch's numerics
        switches fails the check, put back (``pa_oracle.fuzz.run.boundary``)."""
        settings, watch = boundary.judge_numerics(), WATCH
        watch.checkpoint()
        outcome, raised = call_kernel(lambda: self(backend, case, tolerance))
        if breaches := boundary.breaches(settings, watch):  # a check runs the kernel between its judgings: after it all
            message = "; ".join(f"{CONTRACT}: {text}" for text in breaches)
            return check_outcome(self.name, backend.name, "fail", message, [("original", case, None)])
        if raised is not None:  # SystemExit, KeyboardInterrupt, GeneratorExit ... of the kernel: a crash
            tb = "".join(traceback.format_exception(raised, limit=-4))
            message = f"{describe_exception(raised)} (raised by the kernel)\n{tb}"
            return check_outcome(self.name, backend.name, "crash", message, [("original", case, None)])
        assert outcome is not None
        return outcome

    def __call__(self, backend: Backend, case: Case, tolerance: Tolerance = Tolerance()) -> Outcome:
        """Run the check; an explicit refusal skips it, any other exception is a crash finding."""
        try:
            return self.body(backend, case, tolerance)
        except (OracleDisagreement, CaseError):
            raise  # the oracle or the case failed, not the kernel: never a finding
        except Exception as exc:  # noqa: BLE001 - classified below
            message = f"{type(exc).__name__}: {exc}"
            if is_unsupported(exc):
                return check_outcome(self.name, backend.name, "unsupported", message, [("original", case, None)])
            tb = "".join(traceback.format_exception(exc, limit=-4))
            return check_outcome(self.name, backend.name, "crash", f"{message}\n{tb}", [("original", case, None)])

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        # pickled by name (an isolated worker looks it up where it was defined): bodies may be closures
        return _find_check, (self.body.__module__, self.name)


def _find_check(module: str, name: str) -> Check:
    """The ``Check`` named ``name`` among the module-level values (or tuples of them) of ``module``."""
    for value in vars(importlib.import_module(module)).values():
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, Check) and item.name == name:
                return item
    raise LookupError(f"no check named {name!r} in {module}")


def case_key(case: Case) -> str:
    """What a check derives its randomness from: the case's content, not where its tensors are
    stored, so that a saved case (npz sidecar) replays the same permutation or cut."""
    return case.replace(tensors_file=None, meta={}).case_id


def owned(result: KernelOutput) -> KernelOutput:
    """A copy of a kernel's output, taken as soon as it returns: a kernel may write every call into one
    buffer per shape (a CUDA-graph-captured kernel does), and a relation compares outputs of several calls."""
    out, lse = result
    return KernelOutput(out.detach().clone() if isinstance(out, torch.Tensor) else out,
                        lse.detach().clone() if isinstance(lse, torch.Tensor) else lse)


def run_supported(backend: Backend, case: Case, tensors: Tensors, label: str) -> KernelOutput:
    """Plan and run ``case`` (its output copied: ``owned``); a derived case the kernel does not declare
    is a skip, naming it."""
    reason = backend.unsupported_reason(case)
    if reason:
        raise Unsupported(f"the {label} case: {reason}")
    return owned(backend.run(backend.plan(boundary.case_copy(case)), tensors.copy()))


def tensors_for(backend: Backend, case: Case) -> Tensors:
    return make_tensors(case, backend.device or "cpu")


def elementwise_difference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in float64 where equal values (infinities, NaN on both sides) count 0 and a NaN on
    one side counts inf: a relation is about consistency; NaN itself is the oracle's to judge."""
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    same = (a64 == b64) | (torch.isnan(a64) & torch.isnan(b64))
    diff = (a64 - b64).abs()
    return torch.where(same, 0.0, torch.where(torch.isnan(diff), float("inf"), diff))


@dataclass(frozen=True)
class Comparison:
    """Two kernel outputs over the same rows."""

    exact: bool
    out_diff: torch.Tensor  # [rows, Hq, Dvo] float64
    lse_diff: torch.Tensor | None  # [rows, Hq], or None when either side has no LSE

    @property
    def max_out(self) -> float:
        return float(self.out_diff.max()) if self.out_diff.numel() else 0.0

    @property
    def max_lse(self) -> float:
        return float(self.lse_diff.max()) if self.lse_diff is not None and self.lse_diff.numel() else 0.0


def compare_outputs(a: KernelOutput, b: KernelOutput) -> Comparison:
    if a.out.shape != b.out.shape:
        raise ValueError(f"compared outputs have shapes {tuple(a.out.shape)} and {tuple(b.out.shape)}")
    b_out = b.out.to(a.out.device)
    exact = same_bits(a.out, b_out)
    lse_diff = None
    if a.lse is not None and b.lse is not None:
        b_lse = b.lse.to(a.lse.device)
        exact = exact and same_bits(a.lse, b_lse)
        lse_diff = elementwise_difference(a.lse, b_lse)
    return Comparison(exact, elementwise_difference(a.out, b_out), lse_diff)


def allowed_difference(case: Case, tensors: Tensors, tolerance: Tolerance = Tolerance()) -> tuple[float, float]:
    """(out, lse): how far apart two outputs of ``case`` may be when each passes the oracle: twice
    the oracle's allowed max error (it depends on the reference and the controls, not on the
    kernel, so a placeholder output is judged to read it)."""
    heads, device = case.heads, tensors.q.device
    placeholder = KernelOutput(
        torch.zeros(case.layout.total_q, heads.num_qo_heads, heads.head_dim_vo, dtype=torch_dtype(case.options.out_dtype), device=device),
        torch.zeros(case.layout.total_q, heads.num_qo_heads, device=device),
    )
    verdict = judge(case, tensors, placeholder, tolerance)
    if verdict.out is None or verdict.lse is None:
        raise ValueError(f"no error limits for case {case.case_id}: {verdict.failures}")
    return 2 * verdict.out.limit_max, 2 * verdict.lse.limit_max


def worst_location(case: Case, rows: torch.Tensor, out_diff: torch.Tensor) -> Location | None:
    """Where in ``case`` the largest difference is; ``rows[i]`` is the case row of compared row i."""
    if out_diff.numel() == 0 or float(out_diff.max()) == 0:
        return None
    index = int(out_diff.flatten().argmax())
    per_row = out_diff.shape[1] * out_diff.shape[2]
    row, rest = divmod(index, per_row)
    head, dim = divmod(rest, out_diff.shape[2])
    return locate(case, int(rows[row]), head, dim, float(out_diff.flatten()[index]))


@dataclass(frozen=True)
class Relation:
    """One relation's two sides: the kernel's output on ``case`` restricted to ``rows`` (``expected``) and what
    the derived cases gave (``actual``); ``cases`` are every case the relation ran, named, for the report."""

    case: Case
    tensors: Tensors
    expected: KernelOutput
    actual: KernelOutput
    rows: torch.Tensor
    cases: Sequence[tuple[str, Case, Tensors | None]]


def judge_relation(check: str, backend: Backend, relation: Relation, *, exact_required: bool,
                   tolerance: Tolerance = Tolerance(), note: str = "") -> Outcome:
    """The verdict of one relation: ``relation.actual`` against ``relation.expected`` (bit for bit where
    ``exact_required``, else within twice the oracle's error limit)."""
    case, tensors, expected, actual, rows, cases = (relation.case, relation.tensors, relation.expected, relation.actual,
                                                    relation.rows, relation.cases)
    comparison = compare_outputs(expected, actual)
    worst = worst_location(case, rows, comparison.out_diff)
    prefix = f"{note}; " if note else ""
    if comparison.exact:
        return check_outcome(check, backend.name, "pass", prefix + "bit-exact", cases, True, output=expected)
    if exact_required:
        message = (
            f"{prefix}expected bit-exact outputs; max |out diff| {comparison.max_out:.3g}, "
            f"max |lse diff| {comparison.max_lse:.3g}"
        )
        return check_outcome(check, backend.name, "fail", message, cases, False, worst, output=expected)
    out_allowed, lse_allowed = allowed_difference(case, tensors, tolerance)
    within = comparison.max_out <= out_allowed and (comparison.lse_diff is None or comparison.max_lse <= lse_allowed)
    message = (
        f"{prefix}max |out diff| {comparison.max_out:.3g} (allowed {out_allowed:.3g})"
        + (f", max |lse diff| {comparison.max_lse:.3g} (allowed {lse_allowed:.3g})" if comparison.lse_diff is not None else "")
    )
    return check_outcome(check, backend.name, "pass" if within else "fail", message, cases, False, None if within else worst, output=expected)


WATCH.add([sys.modules[__name__]])  # the relations' judging code: a kernel that rebinds it is named and it is put back
