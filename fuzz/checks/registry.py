"""Every check a campaign can run, by name: the comparison with the oracle first, then the
metamorphic relations, the plan checks, the mask check, the CUDA-graph check and the composed-kernel check."""

from __future__ import annotations

from pa_oracle.fuzz.checks.base import Check
from pa_oracle.fuzz.checks.composed import COMPOSED_CHECKS
from pa_oracle.fuzz.checks.cuda_graphs import GRAPH_CHECK
from pa_oracle.fuzz.checks.masks import MASK_CHECKS
from pa_oracle.fuzz.checks.metamorphic import RELATIONS
from pa_oracle.fuzz.checks.plans import PLAN_CHECKS
from pa_oracle.fuzz.run.runner import ORACLE, ORACLE_CHECK
from pa_oracle.fuzz.run.runner import CaseCheck as AnyCheck

CHECKS: dict[str, Check] = {check.name: check for check in (*RELATIONS, *PLAN_CHECKS, *MASK_CHECKS, GRAPH_CHECK, *COMPOSED_CHECKS)}  # beyond the oracle
ALL_CHECKS: dict[str, AnyCheck] = {ORACLE_CHECK: ORACLE, **CHECKS}


def expectation(name: str) -> tuple[str, str] | None:
    """(what a check expects, why) for a report, or None for the oracle comparison."""
    check = CHECKS.get(name)
    return (check.expect, check.why) if check is not None else None
