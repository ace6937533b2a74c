"""Judging and drawing at the same time: while the worker process judges one chunk of cases, the
campaign draws the next one (Hypothesis generation is the campaign process's main cost; judging is
the worker's), so a campaign runs at the pace of the slower of the two, not their sum.

Verification model: a chunk is first *drawn*: the same Hypothesis run on the same seed, with a
test function that applies the engine's filters (a case drawn before is rejected, one a ledger entry
covers is skipped as known) and queues every other case in the worker instead of judging it. While
every case of a chunk passes, Hypothesis draws the same sequence as the engine's own run would (the
test function returned normally at the same examples), so the chunk's outcomes are counted as drawn,
without a second Hypothesis run. A chunk with anything else (a finding, a case the oracle could not
judge, a failed worker, the end of the budget) is run again by the engine's own Hypothesis run, which
takes the outcomes already judged from ``Prefetch`` and judges the rest itself, shrinking included:
that run decides, exactly as without the pipeline.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from pa_oracle.fuzz.run.isolation import IsolatedBackend, OutOfTime, WorkerStartError
from pa_oracle.fuzz.run.runner import CaseCheck, OracleDisagreement, Outcome
from pa_oracle.oracle.case import Case, CaseError

CHUNK_MEMORY = 25  # how many recent cases the pace estimate averages
RESTART_SECONDS = 3.0  # at least what a new worker process costs (spawn, torch import, CUDA context)
_RAISED = (OracleDisagreement, CaseError)  # what collecting a case may raise that belongs to that case


@dataclass
class DrawnChunk:
    """One chunk as drawn: in order, each example the engine's run would count (``("known", case)``:
    skipped as known; ``("queued", case)``: sent to the worker)."""

    index: int
    events: list[tuple[str, Case]] = field(default_factory=list)
    complete: bool = True  # False: drawing or queueing stopped early (the engine's own run decides)
    error: str | None = None  # why the worker could not take a case (OutOfTime, WorkerStartError)

    @property
    def queued(self) -> list[Case]:
        return [case for kind, case in self.events if kind == "queued"]

    @property
    def ids(self) -> set[str]:
        return {case.case_id for _, case in self.events}


class Prefetch:
    """The outcomes of cases queued in ``isolated``'s worker, in the order they were queued, and a
    cache of those collected. ``outcome`` gives the engine's judge a queued case's outcome (None for
    a case never queued: the queue is drained first, so that the case can be judged directly)."""

    def __init__(self, isolated: IsolatedBackend, check: CaseCheck) -> None:
        self.isolated = isolated
        self.check = check
        self.queue: deque[str] = deque()  # case ids queued, not collected
        self.done: dict[str, tuple[Outcome, float] | BaseException] = {}
        self.recent: deque[float] = deque(maxlen=CHUNK_MEMORY)  # worker seconds of the latest cases collected

    def will_finish_by(self, extra: int, deadline: float | None) -> bool:
        """Whether the cases queued now plus ``extra`` more are expected to be judged by ``deadline``
        (at the mean pace of the latest cases; False before any case was collected)."""
        if deadline is None:
            return True
        pace = self.pace()
        processes = self.isolated.worker.processes  # judging side by side
        return pace is not None and time.monotonic() + (len(self.queue) + extra) * pace / processes <= deadline

    def pace(self) -> float | None:
        """Mean worker seconds of the latest cases collected (None before any)."""
        return sum(self.recent) / len(self.recent) if self.recent else None

    def submit(self, case: Case, deadline: float | None) -> None:
        self.isolated.submit(case, deadline, self.check)
        self.queue.append(case.case_id)

    def _collect_one(self, deadline: float | None) -> None:
        if self.isolated.pending == 0:  # the worker was restarted: nothing queued will answer
            self.queue.clear()
            return
        case_id = self.queue.popleft()
        try:
            self.done[case_id] = got = self.isolated.collect(deadline)
            self.recent.append(got[1])
        except _RAISED as exc:
            self.done[case_id] = exc
        except OutOfTime:
            self.queue.clear()  # the worker was stopped: nothing queued will answer
            raise
        if len(self.queue) != self.isolated.pending:  # a hang or a death dropped cases queued after the one in its kernel
            alive = set(self.isolated.pending_ids)
            self.queue = deque(queued for queued in self.queue if queued in alive)

    def collect_through(self, case_ids: list[str], deadline: float | None) -> None:
        """Collect until each of ``case_ids`` is in the cache (or was dropped)."""
        for case_id in case_ids:
            while case_id not in self.done and case_id in self.queue:
                self._collect_one(deadline)

    def outcome(self, case: Case, deadline: float | None) -> tuple[Outcome, float] | None:
        """(outcome, worker seconds) of ``case`` if it was queued; None if not (or dropped)."""
        case_id = case.case_id
        self.collect_through([case_id], deadline)
        if case_id not in self.done:
            self.idle(deadline)  # the caller judges this case itself: the worker must be idle
            return None
        got = self.done.pop(case_id)
        if isinstance(got, BaseException):
            raise got
        return got

    def drain(self, deadline: float | None) -> None:
        """Collect every queued case into the cache (the worker is idle afterwards)."""
        while self.queue:
            self._collect_one(deadline)

    def idle(self, deadline: float | None) -> None:
        """Make the worker idle: collect what is queued, or, when that is expected to take longer
        than starting a new process (say, 20 cases queued behind a finding that is about to be
        shrunk), stop the process instead (its queued cases are then simply not judged)."""
        if not self.queue:
            return
        pace = self.pace()
        restart = max(RESTART_SECONDS, self.isolated.start_seconds / max(self.isolated.starts, 1))
        if pace is not None and len(self.queue) * pace / self.isolated.worker.processes <= restart:
            try:
                self.drain(deadline)
                return
            except OutOfTime:
                pass
        self.isolated.worker.close(graceful=False)
        self.queue.clear()

    def abandon(self) -> None:
        """Stop the worker without waiting for what is queued (after a Ctrl-C or an error of the tool:
        an exchange with the worker may have been cut half-way, so its next answer cannot be trusted)."""
        if self.queue or self.isolated.pending:
            self.isolated.worker.close(graceful=False)
        self.queue.clear()
        self.done.clear()

    def discard(self, deadline: float | None) -> None:
        """Forget every queued and cached outcome (the cases were not counted: a later run draws
        them again), leaving the worker idle by ``deadline``."""
        self.idle(deadline)
        self.done.clear()


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


def draw_chunk(
    index: int,
    run: Callable[[Callable[[Case], None]], None],
    *,
    seen: set[str],
    known: Callable[[Case], Any],
    prefetch: Prefetch,
    deadline: float | None,
    cutoff: float | None,
    announce: Callable[[Case], None] | None = None,
) -> DrawnChunk:
    """Draw chunk ``index`` with ``run`` (the engine's Hypothesis run of that chunk, given a test
    function) and queue its cases: a case whose id is in ``seen`` (or drawn earlier in this chunk)
    is rejected as the engine rejects it, one ``known`` covers is recorded as skipped as known.
    Stops at ``deadline`` (what was drawn before it is the chunk, as in the engine's run); a worker
    that cannot take a case, or anything the drawing raises, ends it with ``complete`` False."""
    from hypothesis.errors import Unsatisfiable

    chunk = DrawnChunk(index)

    class Stop(BaseException):
        pass

    def queue(case: Case) -> None:
        if not _queue(chunk, case, prefetch, cutoff, announce):
            raise Stop

    filtered = chunk_test(seen, known, chunk.events, queue)

    def test(case: Case) -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise Stop
        filtered(case)

    try:
        run(test)
    except Stop:
        pass  # the deadline (the chunk holds what was drawn before it, as the engine's run would) or a failed queue
    except Unsatisfiable:
        pass  # every example was rejected: drawn before, or known
    except Exception:  # noqa: BLE001 - anything else: the engine's own run meets it and decides what it means
        chunk.complete = False
    return chunk


def _queue(chunk: DrawnChunk, case: Case, prefetch: Prefetch, cutoff: float | None,
           announce: Callable[[Case], None] | None) -> bool:
    """Queue a new case of ``chunk`` in the worker; False (the chunk ends, incomplete) if it cannot take it."""
    if announce is not None:
        announce(case)
    try:
        prefetch.submit(case, cutoff)
    except (OutOfTime, WorkerStartError) as exc:
        chunk.complete, chunk.error = False, str(exc)
        return False
    chunk.events.append(("queued", case))
    return True


def queue_drawn(
    index: int,
    events: list[tuple[str, Case]],
    *,
    prefetch: Prefetch,
    deadline: float | None,
    cutoff: float | None,
    announce: Callable[[Case], None] | None = None,
) -> DrawnChunk:
    """Chunk ``index`` from examples drawn elsewhere (``pa_oracle.fuzz.campaign.drawers``: ``("known", case)``
    or ``("new", case)``, in order), queued as ``draw_chunk`` queues them: what comes after ``deadline`` is
    not in the chunk; a worker that cannot take a case ends it incomplete."""
    chunk = DrawnChunk(index)
    for kind, case in events:
        if deadline is not None and time.monotonic() > deadline:
            break
        if kind == "known":
            chunk.events.append(("known", case))
        elif not _queue(chunk, case, prefetch, cutoff, announce):
            break
    return chunk
