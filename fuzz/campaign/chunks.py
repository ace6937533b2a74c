"""A campaign's chunks as data: chunk ``j`` is one Hypothesis run of ``size`` examples on its own seed
(``Chunk``). When a backend's judge works in another process (``pa_oracle.fuzz.run.judge``, ``ahead``), a chunk
is first *drawn* (``draw_chunk``: its cases queued in the judge as they are drawn, or ``queue_drawn``: taken from
a draw process, ``pa_oracle.fuzz.campaign.drawers``), the next chunk drawn while the judge works through this one,
so a campaign runs at the pace of the slower of drawing and judging, not their sum.

Verification model: the drawing runs the same Hypothesis run on the same seed, with a test function that
applies the engine's filters (``chunk_test``: a case drawn before is rejected, one a ledger entry covers is
skipped as known) and queues every other case instead of judging it. While every case of a chunk passes,
Hypothesis draws the same sequence as the engine's own run would (the test function returned normally at the
same examples), so the chunk's outcomes are counted as drawn (``count_clean_chunk``), without a second
Hypothesis run. A chunk with anything else (a finding, a case the oracle could not judge, a failed worker, the
end of the budget) is run again by the engine's own Hypothesis run, which takes the outcomes already judged
from the judge and judges the rest itself, shrinking included: that run decides, exactly as without drawing
ahead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.fuzz.campaign.state import BackendResult
from pa_oracle.fuzz.campaign.tally import count
from pa_oracle.fuzz.campaign.variants import VariantPlan
from pa_oracle.fuzz.draw.determinism import seed_only_draws
from pa_oracle.fuzz.run.isolation import OutOfTime, WorkerStartError
from pa_oracle.fuzz.run.judge import Judge
from pa_oracle.oracle.case import Case


def campaign_settings(max_examples: int) -> Any:
    """The Hypothesis settings of every campaign run: no database (a case's seed is the record),
    no deadline, no health checks (a kernel call is slow), generate and shrink only."""
    return settings(
        max_examples=max_examples, deadline=None, database=None, print_blob=False, report_multiple_bugs=False,
        phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck),
    )


def run_chunk(strategy: Any, shard: Shard, base_seed: int, index: int, n: int, test: Callable[[Any], None]) -> None:
    """Chunk ``index``'s Hypothesis run (``n`` examples) of ``strategy`` with ``test``."""
    with seed_only_draws():
        campaign_settings(n)(seed(shard.chunk_seed(base_seed, index))(given(strategy)(test)))()


@dataclass
class Chunk:
    """Chunk ``index`` of a pair's run: ``size`` examples of the Hypothesis run on ``seed`` (``shard``'s seed of
    the chunk), and, once drawn, in order, each example the engine's run counts (``("known", case)``: skipped as
    known; ``("queued", case)``: submitted to the judge)."""

    index: int
    size: int
    shard: Shard
    base_seed: int
    events: list[tuple[str, Case]] = field(default_factory=list)
    helped: bool = False  # drawn by a draw process (``pa_oracle.fuzz.campaign.drawers``), not here
    complete: bool = True  # False: drawing or queueing stopped early (the engine's own run decides)
    error: str | None = None  # why the judge could not take a case (OutOfTime, WorkerStartError)

    @property
    def seed(self) -> int:
        return self.shard.chunk_seed(self.base_seed, self.index)

    @property
    def queued(self) -> list[Case]:
        return [case for kind, case in self.events if kind == "queued"]

    @property
    def ids(self) -> set[str]:
        return {case.case_id for _, case in self.events}

    def run(self, strategy: Any, test: Callable[[Case], None]) -> None:
        """The chunk's Hypothesis run of ``strategy`` with ``test`` (given each case as drawn)."""
        run_chunk(strategy, self.shard, self.base_seed, self.index, self.size, test)

    def run_cases(self, strategy: Any, test: Callable[[Case], None]) -> None:
        """``run``, ``test`` given each case with its shard's case seed (as the engine judges it)."""
        shard = self.shard
        self.run(strategy, lambda case: test(case.replace(seed=shard.case_seed(case.seed))))


def chunk_test(
    seen: set[str] | frozenset[str], known: Callable[[Case], Any], events: list[tuple[str, Case]], new: Callable[[Case], None],
) -> Callable[[Case], None]:
    """The test function of a chunk's Hypothesis run as the engine's run filters it: a case drawn before (its id
    in ``seen`` or drawn earlier in the chunk) is rejected; one ``known`` covers is recorded in ``events`` as
    ``("known", case)`` and rejected; any other goes to ``new``. What a chunk draws depends on these rejections,
    so the campaign (``draw_chunk``) and its draw processes (``pa_oracle.fuzz.campaign.drawers``) share it."""
    from hypothesis import reject

    drawn = set(seen)

    def test(case: Case) -> None:
        if case.case_id in drawn:
            reject()
        drawn.add(case.case_id)
        if known(case):
            events.append(("known", case))
            reject()
        new(case)

    return test


class _Stop(BaseException):
    """Ends a chunk's drawing (the deadline, or a judge that cannot take a case)."""


def draw_chunk(
    chunk: Chunk, strategy: Any, seen: set[str], known: Callable[[Case], Any], judge: Judge, *,
    deadline: float | None, cutoff: float | None, announce: Callable[[Case], None] | None = None,
) -> Chunk:
    """Draw ``chunk`` from ``strategy`` and submit its cases to ``judge`` (by ``cutoff``): a case whose id is in
    ``seen`` (or drawn earlier in this chunk) is rejected as the engine rejects it, one ``known`` covers is
    recorded as skipped as known. Stops at ``deadline`` (what was drawn before it is the chunk, as in the
    engine's run); a judge that cannot take a case, or anything the drawing raises, ends it with ``complete``
    False."""
    from hypothesis.errors import Unsatisfiable

    def queue(case: Case) -> None:
        if not _queue(chunk, case, judge, cutoff, announce):
            raise _Stop

    filtered = chunk_test(seen, known, chunk.events, queue)

    def test(case: Case) -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise _Stop
        filtered(case)

    try:
        chunk.run_cases(strategy, test)
    except _Stop:
        pass  # the deadline (the chunk holds what was drawn before it, as the engine's run would) or a failed queue
    except Unsatisfiable:
        pass  # every example was rejected: drawn before, or known
    except Exception:  # noqa: BLE001 - anything else: the engine's own run meets it and decides what it means
        chunk.complete = False
    return chunk


def _queue(chunk: Chunk, case: Case, judge: Judge, cutoff: float | None, announce: Callable[[Case], None] | None) -> bool:
    """Submit a new case of ``chunk`` to the judge; False (the chunk ends, incomplete) if it cannot take it."""
    if announce is not None:
        announce(case)
    try:
        judge.submit(case, cutoff)
    except (OutOfTime, WorkerStartError) as exc:
        chunk.complete, chunk.error = False, str(exc)
        return False
    chunk.events.append(("queued", case))
    return True


def queue_drawn(
    chunk: Chunk, events: list[tuple[str, Case]], judge: Judge, *,
    deadline: float | None, cutoff: float | None, announce: Callable[[Case], None] | None = None,
) -> Chunk:
    """``chunk`` from examples a draw process drew (``("known", case)`` or ``("new", case)``, in order), queued
    as ``draw_chunk`` queues them: what comes after ``deadline`` is not in the chunk; a judge that cannot take a
    case ends it incomplete."""
    chunk.helped = True
    for kind, case in events:
        if deadline is not None and time.monotonic() > deadline:
            break
        if kind == "known":
            chunk.events.append(("known", case))
        elif not _queue(chunk, case, judge, cutoff, announce):
            break
    return chunk


def count_clean_chunk(
    result: BackendResult, chunk: Chunk, judge: Judge, seen: set[str], variants: VariantPlan | None,
    on_case: Callable[[BackendResult, bool], None] | None, deadline: float | None,
) -> tuple[bool, str | None]:
    """Count a drawn chunk as the engine's run would have, if every queued case passed or was
    unsupported: (True, None); (True, why) when the budget's end cut it off (the cases judged before
    are counted, as the engine's run counts them); (False, None) otherwise: nothing is counted and
    the outcomes stay in ``judge`` for the engine's own run."""
    cut = None
    try:
        for case in chunk.queued:  # in order; the first case that is not clean ends the wait
            got = judge.peek(case.case_id, deadline)
            if not isinstance(got, tuple) or got[0].status not in ("pass", "unsupported"):
                return False, None  # a finding, an error, a dropped case: the engine's own run judges the chunk
    except OutOfTime as exc:
        cut = str(exc)
    events = chunk.events
    if cut is not None:  # the judged prefix: up to the first queued case without an outcome (nothing is queued now)
        missing = next((i for i, (kind, case) in enumerate(events) if kind == "queued" and not judge.holds(case.case_id)),
                       len(events))
        events = events[:missing]
    for kind, case in events:  # (every queued case of ``events`` was found clean above)
        seen.add(case.case_id)
        result.seen.append(case.case_id)
        if kind == "known":
            result.skipped_known += 1
            continue
        outcome, seconds = judge.take(case.case_id)
        if variants is not None:
            result.compile_seconds += variants.observe(case, seconds)
        count(result, outcome)
        if on_case:
            on_case(result, True)
    return True, cut
