"""Whether a campaign result is a verdict: the one definition of "complete", which ``BackendResult.is_complete``
and the exit code (``pa_oracle.fuzz.exits.campaign_exit_code``) both ask. Light: no torch, no Hypothesis."""

from __future__ import annotations

from typing import Any

COMPLETE_STATUSES = ("pending", "running", "done", "finding")


def why_incomplete(result: Any, *, may_be_empty: bool = False) -> str | None:
    """Why a campaign result (an attention pair's ``BackendResult``, a write kernel's too) is no
    verdict (exit 3), or None: the one definition of "complete" (``BackendResult.is_complete`` asks it). No
    verdict: it stopped for another reason than its example count, time budget or a finding (a status
    outside ``COMPLETE_STATUSES``), it ran no example although it should have (``may_be_empty``: the time
    budget ran out, or its share of the examples is 0), or its examples judged nothing
    (``BackendResult.judged_nothing``). A check that cannot apply to the backend owes no verdict."""
    if getattr(result, "not_applicable", None) is not None:
        return None  # the check cannot apply to this backend: said by name
    if getattr(result, "not_built", None) is not None and not result.findings:
        return None  # the compile plan built none of its variants: said by name, no failure of the tool
    nothing = result.judged_nothing() if result.examples and hasattr(result, "judged_nothing") else None
    if nothing is not None and (result.status in COMPLETE_STATUSES or nothing in result.notes):
        return f"{result.backend} judged nothing: {nothing}"
    if result.status not in COMPLETE_STATUSES:
        notes = f": {result.notes[-1]}" if result.notes else ""
        return f"{result.backend} stopped early ({result.status}) after {result.examples} examples{notes}"
    if result.examples == 0 and not result.findings and not may_be_empty:
        return f"{result.backend} ran no example"
    return None
