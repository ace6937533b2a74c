"""A custom mask belongs to one call (FlashInfer PR #1028: after a plan with a custom mask, a
re-plan of the same shapes for causal attention kept the old mask).

``mask-replan``: run the case, then the same layout with another custom mask, then the case
again; each run must pass the oracle. The case is drawn without a mask where the kernel takes
unmasked cases (PR #1028's switch back), else with a mask of its own (the other mask lives on
the same layout, so masks stay valid); the other mask keeps at least one visible key in every row that has one (no empty rows: those are
another class, ``mask_empty_row``) and hides at least one key the case's attention sees. A
kernel whose adapter can re-plan one plan object (``replan(plan, case) -> plan``, as a FlashInfer
wrapper is planned again) is run on one plan throughout; any other kernel gets a fresh plan per
run, so only state the kernel itself keeps between calls (a cache keyed by shape) can go stale.
A wrong third run after a right first one is the finding "stale mask".
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from pa_oracle.backends.base import Backend, Capabilities, Unsupported
from pa_oracle.fuzz.checks.base import Check, case_key, check_outcome, tensors_for
from pa_oracle.fuzz.run.runner import Outcome, judge
from pa_oracle.oracle.case import Case, CustomMask
from pa_oracle.oracle.visibility import attended, visible_keys
from pa_oracle.oracle.tolerance import Tolerance


@runtime_checkable
class Replannable(Protocol):
    """An adapter whose plan object can be planned again for another case of the same layout."""

    def replan(self, plan: Any, case: Case) -> Any: ...


def with_other_mask(case: Case) -> Case:
    """``case``'s layout and tensors with another custom mask (module docstring), drawn from the
    case's content so a saved case replays it."""
    rng = np.random.default_rng(random.Random(f"mask-replan:{case_key(case)}").getrandbits(64))
    visible, before = visible_keys(case), attended(case)
    masks = []
    for keep in visible:
        mask = rng.random(keep.shape) < 0.5
        for row in np.flatnonzero(keep.any(axis=1)):  # the row's last visible key stays: no empty rows
            mask[row, np.flatnonzero(keep[row])[-1]] = True
        masks.append(mask)
    if all(np.array_equal(v & m, b) for v, m, b in zip(visible, masks, before)):
        # the random draw hid nothing the case sees: hide every visible key but each row's last
        masks = [np.zeros_like(keep) for keep in visible]
        for mask, keep in zip(masks, visible):
            for row in np.flatnonzero(keep.any(axis=1)):
                mask[row, np.flatnonzero(keep[row])[-1]] = True
        if all(np.array_equal(v & m, b) for v, m, b in zip(visible, masks, before)):
            raise Unsupported("every row of this layout sees one key at most: no other mask without empty rows")
    return case.replace(custom_mask=CustomMask.from_dense(masks), tensors_file=None, meta={})


def _mask_replan(backend: Backend, case: Case, tolerance: Tolerance) -> Outcome:
    other = with_other_mask(case)
    for label, c in (("the case", case), ("the case with another mask", other)):
        reason = backend.unsupported_reason(c)
        if reason:
            raise Unsupported(f"{label}: {reason}")
    replan = backend.replan if isinstance(backend, Replannable) else (lambda _plan, c: backend.plan(c))
    cases = [("original", case, None), ("other-mask", other, None)]
    plan: Any = None
    how = "one plan, re-planned" if isinstance(backend, Replannable) else "a fresh plan each"
    for step, run_case in enumerate((case, other, case)):
        plan = backend.plan(run_case) if plan is None else replan(plan, run_case)
        tensors = tensors_for(backend, run_case)
        verdict = judge(run_case, tensors, backend.run(plan, tensors.copy()), tolerance)
        if verdict.passed:
            continue
        if step == 0:
            message = (
                "the first run fails, before this check's other mask: a plain fuzz finding, or state an earlier call of "
                f"this layout left (replay the case in a fresh process to tell): {verdict.headline()}"
            )
        elif step == 1:
            message = f"the run with another mask fails after the case's run (a fuzz finding of the masked case?): {verdict.headline()}"
        else:
            message = (
                f"stale mask: the case passed, then failed after a run with another custom mask of its layout "
                f"({how}; FlashInfer PR #1028): {verdict.headline()}"
            )
        return check_outcome("mask-replan", backend.name, "fail", message, cases)
    return check_outcome("mask-replan", backend.name, "pass", f"case, other mask, case again ({how}): all pass", cases)


def _takes_masks(backend: Backend) -> Capabilities | str:
    if True not in backend.capabilities.custom_mask:
        return "the kernel takes no custom mask: no mask to go stale"
    return backend.capabilities


@dataclass(frozen=True)
class _SameLayoutCheck(Check):
    """A check whose derived case keeps the layout, so a drawn case may carry its mask. A kernel
    that takes unmasked cases too gets unmasked ones (mask -> no mask is PR #1028's switch, and a
    drawn mask's empty rows are another class); a masks-only kernel gets masked ones (mask -> mask)."""

    def capabilities(self, backend: Backend) -> Capabilities | str:
        caps = self.prepare(backend)
        if isinstance(caps, Capabilities) and False in caps.custom_mask:
            caps = caps.replace(custom_mask=(False,))
        return caps


MASK_CHECKS = (
    _SameLayoutCheck("mask-replan", "oracle", "a custom mask belongs to one call: every run must pass the oracle",
                     _mask_replan, _takes_masks),
)
