"""Counting judged cases into a ``BackendResult``: what each outcome adds (``count``), whether a case can
compare anything (``attends_a_key``), and the mark of a pair that judged nothing (``settle_judged_nothing``)."""

from __future__ import annotations

import math

from pa_oracle.backends.user import REFUSES_VIEWS
from pa_oracle.fuzz.campaign.state import BackendResult
from pa_oracle.fuzz.run.runner import ORACLE, Outcome
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.report import limit_ratio
from pa_oracle.oracle.visibility import attended


def count(result: BackendResult, outcome: Outcome) -> None:
    """Add one judged case (found by the search, not a shrink step) to ``result``."""
    result.examples += 1
    result.passed += outcome.status == "pass"
    result.unsupported += outcome.status == "unsupported"
    result.exact += outcome.status == "pass" and bool(outcome.exact)
    if outcome.status == "unsupported":
        reason = outcome.message.splitlines()[0] if outcome.message else ""
        if outcome.check == ORACLE.name:  # one kind counted by name (an oracle case's reasons are many and long)
            reason = REFUSES_VIEWS if reason.removeprefix("Unsupported: ").startswith(REFUSES_VIEWS) else ""
        if reason:
            result.skip_reasons[reason] = result.skip_reasons.get(reason, 0) + 1
    if outcome.status != "unsupported" and isinstance(outcome.case, Case):  # (a write case: no attention features)
        result.coverage.add(outcome.case)
        result.no_keys += not attends_a_key(outcome.case)
    if outcome.status == "pass" and outcome.verdict is not None and outcome.verdict.out is not None:
        if math.isfinite(ratio := outcome.verdict.out.ratio):  # inf: the control was exact, the kernel within the floor
            result.worst_ratio = max(result.worst_ratio, ratio)
        if math.isfinite(allowed := limit_ratio(outcome.verdict.out)):
            result.worst_allowed = max(result.worst_allowed, allowed)


def attends_a_key(case: Case) -> bool:
    """Whether some query row of ``case`` attends some key (``pa_oracle.oracle.case``): a case where none
    does has output 0 and LSE -inf everywhere, and a kernel that declines every other case passes only such.
    Without a custom mask a request with a query and a key has one (its last query sees its last key: the
    causal and window tests both allow the key at the query's own position)."""
    if case.custom_mask is None:
        return any(qo > 0 and kv > 0 for qo, kv in zip(case.layout.qo_lens, case.layout.kv_lens))
    return any(bool(rows.any()) for rows in attended(case))


def settle_judged_nothing(result: BackendResult) -> bool:
    """Mark a pair that judged nothing incomplete, never ok; True if it did. At a turn's end: none ran,
    or each was unsupported. At its end (its count reached): any reason ``BackendResult.judged_nothing``
    gives (every judged case attended no key, nearly every case unsupported): a share is judged on the
    whole run, not on a first turn's few cases."""
    if result.status in ("finding", "incomplete", "exhausted") or result.findings:
        return False
    why = result.judged_nothing()
    if why is None or (result.status != "done" and result.examples > result.unsupported):
        return False
    result.status = "incomplete"
    if why not in result.notes:
        result.notes.append(why)
    return True
