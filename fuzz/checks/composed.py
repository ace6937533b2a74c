"""A composed kernel against the uncomposed kernels of its library (``composed-vs-parts``).

A composed adapter (FlashInfer's POD: prefill + decode in one launch; the cascade: prefix and
suffix states merged) names its parts as data (``Backend.parts``: which requests each part runs,
on which backend). The check runs the composed kernel on the case and each part on its requests'
sub-case (the same page pool, q's rows of those requests), puts the parts' rows back in the case's
order, and compares.

Verification model. Both outputs are judged against the oracle's float64 result; two kernels that
each pass it differ by at most twice its allowed error (``allowed_difference``: triangle
inequality), so a larger difference means one of them is wrong, and their oracle verdicts say
which. The check also fails when the composed kernel fails the oracle while its parts pass it (the
composition lost what the parts keep) even within that difference. Both failing alike is the
oracle check's finding, not this one's: reported, not failed.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch
from pa_oracle.backends import get_backend
from pa_oracle.backends.base import Backend, Capabilities, KernelOutput
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.checks.base import Check, check_outcome, compare_outputs, run_supported, tensors_for, worst_location
from pa_oracle.fuzz.run.runner import Outcome, judge
from pa_oracle.oracle.case import Case, Layout
from pa_oracle.oracle.tensors import Tensors
from pa_oracle.oracle.visibility import attended
from pa_oracle.oracle.tolerance import Tolerance

NAME = "composed-vs-parts"
REQUEST_SETS = ("all", "decode", "prefill")


def part_requests(layout: Layout, requests: str) -> list[int]:
    """The requests a part runs (``Part.requests``): all, the qo_len 1 ones, or every other one."""
    if requests == "all":
        return list(range(layout.batch_size))
    decode = requests == "decode"
    return [b for b, n in enumerate(layout.qo_lens) if (n == 1) == decode]


def check_parts(backend: Backend) -> None:
    """Raise ValueError when ``backend.parts`` does not cover every request exactly once (a wrong
    declaration is the adapter's bug, never a skip or a finding)."""
    sets = [part.requests for part in backend.parts]
    unknown = [s for s in sets if s not in REQUEST_SETS]
    if unknown:
        raise ValueError(f"{backend.name}.parts: request sets {unknown} not in {REQUEST_SETS}")
    if sorted(sets) not in (["all"], ["decode", "prefill"]):
        raise ValueError(f"{backend.name}.parts: request sets {sets} must be ['all'] or ['prefill', 'decode'] (every request once)")


@functools.cache
def part_backend(spec: str) -> Backend:
    """A part's backend: a registered name, or a user kernel's ``MODULE:FUNCTION``."""
    return UserKernel.from_spec(spec) if ":" in spec else get_backend(spec)


def sub_case(case: Case, requests: list[int]) -> Case:
    """``case`` reduced to ``requests`` (in order), over the same page pool."""
    return case.replace(layout=case.layout.subset(requests), tensors_file=None, meta={})


def run_parts(backend: Backend, case: Case, tensors: Tensors, like: KernelOutput) -> tuple[KernelOutput, list[tuple[str, Case, Tensors | None]]]:
    """The parts' output over the whole case (rows in the case's order; ``like`` gives shapes and
    dtypes), and the sub-cases they ran."""
    out = torch.zeros_like(like.out)
    lse = None if like.lse is None else torch.full_like(like.lse, float("-inf"))
    cases: list[tuple[str, Case, Tensors | None]] = []
    for part in backend.parts:
        requests = part_requests(case.layout, part.requests)
        if not requests:
            continue
        rows = torch.tensor(case.layout.rows_of(requests), dtype=torch.long)
        sub = sub_case(case, requests)
        sub_tensors = Tensors(tensors.q[rows.to(tensors.q.device)], tensors.k_cache, tensors.v_cache, tensors.storage,
                              tensors.pool, tensors.kv_cache)
        cases.append((f"part-{part.requests}", sub, sub_tensors))
        result = run_supported(part_backend(part.backend), sub, sub_tensors, f"{part.requests} part ({part.backend})")
        out[rows.to(out.device)] = result.out.to(out.device, out.dtype)
        if lse is not None:
            if result.lse is None:
                lse = None
            else:
                lse[rows.to(lse.device)] = result.lse.to(lse.device, lse.dtype)
    return KernelOutput(out, lse), cases


def _composed_vs_parts(backend: Backend, case: Case, tolerance: Tolerance) -> Outcome:
    check_parts(backend)
    tensors = tensors_for(backend, case)
    composed = run_supported(backend, case, tensors, "composed")
    parts, part_cases = run_parts(backend, case, tensors, composed)
    cases = [("original", case, tensors), *part_cases]
    names = " + ".join(f"{p.backend} on {p.requests}" for p in backend.parts)
    composed_verdict, parts_verdict = judge(case, tensors, composed, tolerance), judge(case, tensors, parts, tolerance)
    if composed_verdict.out is None or (composed.lse is not None and composed_verdict.lse is None):
        raise ValueError(f"no error limits for case {case.case_id}: {composed_verdict.failures}")
    comparison = compare_outputs(composed, parts)
    if comparison.lse_diff is not None:  # a row with no key: its LSE is the oracle check's (a sentinel merged twice moves by log 2)
        keyless = ~torch.from_numpy(np.concatenate([m.any(axis=1) for m in attended(case)]))
        comparison = dataclasses.replace(comparison, lse_diff=comparison.lse_diff.masked_fill(keyless.to(comparison.lse_diff.device)[:, None], 0.0))
    out_allowed = 2 * composed_verdict.out.limit_max
    lse_allowed = 2 * composed_verdict.lse.limit_max if composed_verdict.lse is not None else 0.0
    apart = comparison.max_out > out_allowed or (comparison.lse_diff is not None and comparison.max_lse > lse_allowed)
    lost = not composed_verdict.passed and parts_verdict.passed
    message = (
        f"composed vs parts ({names}): max |out diff| {comparison.max_out:.3g} (allowed {out_allowed:.3g})"
        + (f", max |lse diff| {comparison.max_lse:.3g} (allowed {lse_allowed:.3g})" if comparison.lse_diff is not None else "")
        + f"; composed vs oracle: {composed_verdict.headline()}; parts vs oracle: {parts_verdict.headline()}"
    )
    if apart or lost:
        why = "composed and parts differ by more than two passing kernels can" if apart else "the composed kernel fails the oracle, its parts pass"
        worst = worst_location(case, torch.arange(case.layout.total_q), comparison.out_diff)
        return check_outcome(NAME, backend.name, "fail", f"{why}: {message}", cases, comparison.exact, worst, output=composed)
    if not composed_verdict.passed:
        message += " (both fail the oracle alike: the oracle check's finding)"
    return check_outcome(NAME, backend.name, "pass", ("bit-exact; " if comparison.exact else "") + message, cases,
                         comparison.exact, output=composed)


def _composed_capabilities(backend: Backend) -> Capabilities | str:
    if not backend.parts:
        return "the kernel is not composed: it names no uncomposed parts (Backend.parts)"
    check_parts(backend)
    return backend.capabilities


COMPOSED_CHECKS = (
    Check(NAME, "tolerance", "the parts run other tiles and round their own way; both are judged against the oracle",
          _composed_vs_parts, _composed_capabilities),
)

__all__ = ["COMPOSED_CHECKS", "part_requests", "run_parts", "sub_case"]
