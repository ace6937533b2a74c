"""One judging layer: every caller that judges cases (the campaign engine, replay, triage) gets a ``Judge``
from ``judge_for``, the one place that decides whether a backend's cases run in this process or in a
worker process (``pa_oracle.fuzz.run.isolation``), and talks to it through one interface:

- ``submit(case)`` queues a case, ``collect()`` gives back the oldest queued case's (outcome, seconds);
- ``outcome(case)`` gives one case's outcome: the one judged while it was queued, else judged now;
- ``pending``, ``start_seconds``, ``rejudged_changed``, ``will_finish_by``, ``close``.

``InProcessJudge`` judges a queued case when it is collected; ``IsolatedJudge`` sends it to its worker
process (or a ``WorkerPool``) at once, which judges while the caller draws the next cases.

Verification model: both keep the outcomes in the order submitted and give each to its own case: a case
dropped by a death or a hang of its process (``Worker``'s rules) has no outcome, and is judged again by
``outcome`` if asked for. What judging a case raised that belongs to that case (the oracle disagreeing
with itself, a case that cannot exist) is raised where its outcome is asked for, not earlier; the end of the
time budget (``OutOfTime``) drops every queued case.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from contextlib import contextmanager
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pa_oracle.fuzz.run.isolation import (
    CASE_TIMEOUT, FIRST_CASE_FACTOR, OUT_OF_TIME, IsolatedBackend, OutOfTime, isolatable, isolated_by_default,
)
from pa_oracle.fuzz.run.pool import WorkerPool, worker_processes
from pa_oracle.fuzz.run.runner import ORACLE, CaseCheck, OracleDisagreement, Outcome, engine_from_env
from pa_oracle.oracle.case import Case, CaseError
from pa_oracle.oracle.tolerance import Tolerance

PACE_MEMORY = 25  # how many recent cases the pace estimate averages
RESTART_SECONDS = 3.0  # at least what a new worker process costs (spawn, torch import, CUDA context)
_RAISED = (OracleDisagreement, CaseError)  # what collecting a case may raise that belongs to that case

Got = tuple[Outcome, float]  # an outcome and the seconds spent judging it


@dataclass(frozen=True)
class JudgeSettings:
    """How a backend's cases are judged: ``isolate`` (None: ``isolated_by_default``), a worker's ``timeout`` and
    ``first_case_factor``, the ``tolerance``, outcomes with the kernel's output (``keep_output``) or a pass's
    per-element errors (``pass_errors``, isolated only), and ``ahead``: the caller draws its next cases while an
    isolated judge's worker judges the queued ones (the campaign's pipeline)."""

    isolate: bool | None = None
    timeout: float = CASE_TIMEOUT
    tolerance: Tolerance = field(default_factory=Tolerance)
    first_case_factor: float = FIRST_CASE_FACTOR
    keep_output: bool = False
    pass_errors: bool = False
    ahead: bool = False


def isolates(backend: Any, isolate: bool | None) -> bool:
    """Whether ``backend``'s cases are meant for a worker process: ``isolate``, or by default
    ``isolated_by_default`` (whether one can load it is ``isolatable``'s question)."""
    return isolated_by_default(backend) if isolate is None else isolate


def judge_for(backend: Any, check: CaseCheck = ORACLE, settings: JudgeSettings = JudgeSettings(),
              workers: dict[str, Any] | None = None) -> Judge:
    """The judge of ``backend``'s cases by ``check``: isolated when ``settings`` (or the default) says so and a
    worker can load the backend (else in this process, with the reason in ``note``). ``workers``: one
    ``WorkerPool`` per device shared by a campaign's backends (a missing one is made and added; the caller
    closes them); without it the judge has a worker of its own, which ``close`` ends."""
    if not isolates(backend, settings.isolate):
        return InProcessJudge(backend, check, settings)
    spec = isolatable(backend)  # what a worker can load it from
    if spec is None:
        why = f"{backend.name} is not importable by its name: its cases ran in this process"
        return InProcessJudge(backend, check, settings, note=why)
    worker = None
    if workers is not None:  # one worker per device, shared by every backend and check
        device = backend.device or "cpu"
        worker = workers.get(device) or workers.setdefault(
            device, WorkerPool(worker_processes(device), timeout=settings.timeout, tolerance=settings.tolerance))
    isolated = IsolatedBackend(backend, spec, timeout=settings.timeout, tolerance=settings.tolerance,
                               first_case_factor=settings.first_case_factor, keep_output=settings.keep_output,
                               judge=check, worker=worker, pass_errors=settings.pass_errors)
    ahead = settings.ahead and getattr(check, "pipelined", True)  # (a check whose cases no chunk draws says False)
    return IsolatedJudge(isolated, check, ahead=ahead)


class Judge(ABC):
    """Cases judged in the order submitted, their outcomes kept by case id until taken. Subclasses say how
    a case is sent (``_send``), how the oldest sent case's outcome comes back (``_receive``), what is still
    sent and not answered (``_waiting_ids``), and how one case is judged alone (``_alone``)."""

    isolated = False  # the cases run in a worker process
    ahead = False  # the caller draws its next cases while the queued ones are judged (``JudgeSettings.ahead``)
    note: str | None = None  # why the cases run in this process though isolation was asked for

    def __init__(self, check: CaseCheck) -> None:
        self.check = check
        self.queue: deque[str] = deque()  # case ids submitted, not collected
        self.done: dict[str, Got | BaseException] = {}  # collected, not taken
        self.recent: deque[float] = deque(maxlen=PACE_MEMORY)  # judging seconds of the latest cases collected

    # -- what an implementation provides

    @abstractmethod
    def _send(self, case: Case, deadline: float | None) -> None:
        """Send ``case`` to be judged after those sent before."""

    @abstractmethod
    def _receive(self, deadline: float | None) -> Got:
        """The oldest sent case's (outcome, seconds), waiting for it until ``deadline`` (``OutOfTime``)."""

    @property
    @abstractmethod
    def _waiting(self) -> int:
        """Cases sent and not answered (fewer than queued: a death or a hang dropped some)."""

    @property
    @abstractmethod
    def _waiting_ids(self) -> list[str]:
        """The ids of the cases sent and not answered, oldest first."""

    @abstractmethod
    def _alone(self, case: Case, deadline: float | None) -> Outcome:
        """``case`` judged now, with nothing sent before it waiting."""

    @abstractmethod
    def _stop(self) -> None:
        """Stop judging what was sent, without waiting for it (it is not judged)."""

    @property
    def processes(self) -> int:
        """How many cases are judged side by side."""
        return 1

    @property
    def start_seconds(self) -> float:
        """Seconds spent starting worker processes and loading the backend so far (0 in this process)."""
        return 0.0

    @property
    def starts(self) -> int:
        return 0

    @property
    def rejudged_changed(self) -> int:
        """Cases judged beside another whose verdict changed when judged again alone (``Worker``)."""
        return 0

    def close(self) -> None:
        """End what this judge started (a shared worker keeps running: its owner closes it)."""

    # -- the interface

    @property
    def pending(self) -> int:
        """Cases submitted and not collected."""
        return len(self.queue)

    def submit(self, case: Case, deadline: float | None = None) -> None:
        """Queue ``case`` (``OutOfTime`` or ``WorkerStartError`` if a worker cannot take it by ``deadline``)."""
        self._send(case, deadline)
        self.queue.append(case.case_id)

    def collect(self, deadline: float | None = None) -> Got:
        """(outcome, seconds) of the oldest case submitted and not collected (a case dropped by a death or a hang
        of its process is passed over); raises what judging it raised, ``OutOfTime`` past ``deadline``."""
        while self.queue:
            case_id = self._collect_one(deadline)
            if case_id is not None:
                return self.take(case_id)
        raise LookupError("collect() with no case pending")

    def outcome(self, case: Case, deadline: float | None = None) -> tuple[Outcome, float | None]:
        """(``case``'s outcome, the seconds spent judging it if it was queued, else None): its queued outcome,
        or judged now, alone (what is queued is collected, or dropped, first)."""
        got = self.peek(case.case_id, deadline)
        if got is not None:
            return self.take(case.case_id)
        self.idle(deadline)
        if self.ahead and deadline is not None and time.monotonic() > deadline:
            raise OutOfTime(f"{OUT_OF_TIME} before case {case.case_id}")  # (its queued outcome was dropped)
        return self._alone(case, deadline), None

    def judge(self, case: Case, deadline: float | None = None) -> Outcome:
        """``case``'s outcome (``outcome``)."""
        return self.outcome(case, deadline)[0]

    def holds(self, case_id: str) -> bool:
        """Whether ``case_id`` was submitted and its outcome not taken yet."""
        return case_id in self.done or case_id in self.queue

    def peek(self, case_id: str, deadline: float | None = None) -> Got | BaseException | None:
        """Collect until ``case_id`` is answered: its outcome (or what judging it raised), kept for ``take``;
        None if it was not submitted or was dropped."""
        while case_id not in self.done and case_id in self.queue:
            self._collect_one(deadline)
        return self.done.get(case_id)

    def take(self, case_id: str) -> Got:
        """A collected case's (outcome, seconds), forgotten here; raises what judging it raised."""
        got = self.done.pop(case_id)
        if isinstance(got, BaseException):
            raise got
        return got

    def _collect_one(self, deadline: float | None) -> str | None:
        """Collect the oldest case sent into ``done``: its id (None: nothing sent will answer)."""
        if self._waiting == 0:  # the worker was restarted: nothing queued will answer
            self.queue.clear()
            return None
        case_id = self.queue.popleft()
        try:
            self.done[case_id] = got = self._receive(deadline)
            self.recent.append(got[1])
        except _RAISED as exc:
            self.done[case_id] = exc
        except OutOfTime:
            self.queue.clear()  # the worker was stopped: nothing queued will answer
            raise
        if len(self.queue) != self._waiting:  # a hang or a death dropped cases queued after the one in its kernel
            alive = set(self._waiting_ids)
            self.queue = deque(queued for queued in self.queue if queued in alive)
        return case_id

    def pace(self) -> float | None:
        """Mean judging seconds of the latest cases collected (None before any)."""
        return sum(self.recent) / len(self.recent) if self.recent else None

    def will_finish_by(self, extra: int, deadline: float | None) -> bool:
        """Whether the cases queued now plus ``extra`` more are expected to be judged by ``deadline`` (at the
        mean pace of the latest cases; False before any case was collected)."""
        if deadline is None:
            return True
        pace = self.pace()
        return pace is not None and time.monotonic() + (len(self.queue) + extra) * pace / self.processes <= deadline

    def drain(self, deadline: float | None) -> None:
        """Collect every queued case (nothing is being judged afterwards)."""
        while self.queue:
            self._collect_one(deadline)

    def idle(self, deadline: float | None) -> None:
        """Judge nothing queued any more: collect what is queued, or, when that is expected to take longer than
        starting a new process (say, 20 cases queued behind a finding that is about to be shrunk), stop the
        process instead (its queued cases are then simply not judged)."""
        if not self.queue:
            return
        pace = self.pace()
        restart = max(RESTART_SECONDS, self.start_seconds / max(self.starts, 1))
        if pace is not None and len(self.queue) * pace / self.processes <= restart:
            try:
                self.drain(deadline)
                return
            except OutOfTime:
                pass
        self._stop()
        self.queue.clear()

    def abandon(self) -> None:
        """Stop without waiting for what is queued (after a Ctrl-C or an error of the tool: an exchange with a
        worker may have been cut half-way, so its next answer cannot be trusted)."""
        if self.queue or self._waiting:
            self._stop()
        self.queue.clear()
        self.done.clear()

    def discard(self, deadline: float | None) -> None:
        """Forget every queued and collected outcome (their cases were not counted), idle by ``deadline``."""
        self.idle(deadline)
        self.done.clear()


class InProcessJudge(Judge):
    """Cases judged in this process, a queued one when it is collected (``CaseCheck.judge``)."""

    def __init__(self, backend: Any, check: CaseCheck = ORACLE, settings: JudgeSettings = JudgeSettings(), *,
                 note: str | None = None) -> None:
        super().__init__(check)
        self.backend, self.settings, self.note = backend, settings, note
        self._sent: deque[Case] = deque()

    def _run(self, case: Case) -> Outcome:
        return self.check.judge(case, self.backend, self.settings.tolerance, self.settings.keep_output)

    def _send(self, case: Case, deadline: float | None) -> None:
        self._sent.append(case)

    def _receive(self, deadline: float | None) -> Got:
        if deadline is not None and time.monotonic() > deadline:
            late = self._sent[0].case_id
            self._sent.clear()  # as a worker stopped at the budget's end: nothing queued is judged
            raise OutOfTime(f"{OUT_OF_TIME} before case {late}")
        case = self._sent.popleft()
        started = time.monotonic()
        return self._run(case), time.monotonic() - started

    @property
    def _waiting(self) -> int:
        return len(self._sent)

    @property
    def _waiting_ids(self) -> list[str]:
        return [case.case_id for case in self._sent]

    def _alone(self, case: Case, deadline: float | None) -> Outcome:
        return self._run(case)

    def _stop(self) -> None:
        self._sent.clear()


class IsolatedJudge(Judge):
    """Cases judged in ``isolated``'s worker process (or pool): a queued case is sent at once."""

    isolated = True

    def __init__(self, isolated: IsolatedBackend, check: CaseCheck = ORACLE, *, ahead: bool = False) -> None:
        super().__init__(check)
        self.backend, self.ahead = isolated, ahead

    def _send(self, case: Case, deadline: float | None) -> None:
        self.backend.submit(case, deadline, self.check)

    def _receive(self, deadline: float | None) -> Got:
        return self.backend.collect(deadline)

    @property
    def _waiting(self) -> int:
        return self.backend.pending

    @property
    def _waiting_ids(self) -> list[str]:
        return self.backend.pending_ids

    def _alone(self, case: Case, deadline: float | None) -> Outcome:
        return self.backend.check(case, deadline, self.check)

    def _stop(self) -> None:
        self.backend.worker.close(graceful=False)

    @property
    def processes(self) -> int:
        return self.backend.worker.processes

    @property
    def start_seconds(self) -> float:
        return self.backend.start_seconds

    @property
    def starts(self) -> int:
        return self.backend.starts

    @property
    def rejudged_changed(self) -> int:
        return self.backend.worker.rejudged_changed

    def close(self) -> None:
        self.backend.close()


@contextmanager
def case_judge(
    backend: Any, *, isolate: bool | None = None, timeout: float = CASE_TIMEOUT, tolerance: Tolerance = Tolerance(),
    first_case_factor: float = FIRST_CASE_FACTOR, keep_output: bool = False, judge: CaseCheck = ORACLE,
) -> Iterator[Callable[[Case], Outcome]]:
    """A function judging cases on ``backend`` with ``judge`` (default: the oracle comparison), one at a time,
    as ``judge_for`` chooses (a pass keeps its per-element errors: a repro's report shows its worst elements).
    Used by replay and triage, so a crash or hang finding replays as one."""
    engine_from_env()  # a bad PA_ORACLE_ENGINE is bad input before any case
    chosen = judge_for(backend, judge, JudgeSettings(isolate, timeout, tolerance, first_case_factor, keep_output,
                                                     pass_errors=True))
    try:
        yield chosen.judge
    finally:
        chosen.close()
