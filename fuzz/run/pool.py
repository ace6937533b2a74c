"""Several worker processes judging one device's cases, in the order they were sent.

One worker process judges only as fast as one Python process's host work allows (~100 cases a second
on the H200: ~400 torch operators a case under one GIL), far below what the device can run. A
``WorkerPool`` sends each case to the process with the fewest cases pending and gives the outcomes
back in the order the cases were sent, so a campaign draws and counts exactly as with one process:
the same seed draws the same cases. Each process is a ``Worker`` with its own crash and hang rules
(``pa_oracle.fuzz.run.isolation``): a death or a hang drops the cases sent to *that* process after
the case in its kernel, and ``pending_ids`` says which cases are still to come.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

from pa_oracle.fuzz.run.isolation import CASE_TIMEOUT, FIRST_CASE_FACTOR, STARTUP_SECONDS, OutOfTime, Worker
from pa_oracle.fuzz.run.runner import CaseCheck, OracleDisagreement, Outcome, engine_from_env
from pa_oracle.oracle.case import Case, CaseError
from pa_oracle.oracle.errors import BadInput, env_count
from pa_oracle.oracle.tolerance import Tolerance

ENV = "PA_ORACLE_WORKER_PROCESSES"
# an accelerator's worker processes: one, and one more for each 8 host cores (the campaign, its draw processes and the
# workers share them), at most 3: 3 judged 13% more than 2 on a 16-core H200 host (benchmarks/RESULTS.md)
CORES_PER_PROCESS = 8
MAX_ACCELERATOR_PROCESSES = 3


class BadWorkerProcesses(BadInput):
    """``PA_ORACLE_WORKER_PROCESSES`` is not a whole number >= 1 (bad input: exit 2)."""


def worker_processes(device: str, cores: int | None = None) -> int:
    """``PA_ORACLE_WORKER_PROCESSES`` if set, else for an accelerator one more process for each ``CORES_PER_PROCESS``
    ``cores`` (default: the host's), at most ``MAX_ACCELERATOR_PROCESSES``: one below 8 cores, 2 below 16, then 3;
    for the CPU one."""
    engine_from_env()  # read where a campaign checks its environment before anything runs: a bad PA_ORACLE_ENGINE too
    count = env_count(ENV, 1, BadWorkerProcesses, "a whole number of worker processes >= 1")
    if count is None:
        cores = (os.cpu_count() or 1) if cores is None else cores
        return 1 if device == "cpu" else min(MAX_ACCELERATOR_PROCESSES, cores // CORES_PER_PROCESS + 1)
    return count


class WorkerPool:
    """``processes`` restartable workers behind ``Worker``'s interface (``submit``, ``collect`` in the order
    sent, ``check``, ``pending``, ``close``). They start and load a backend side by side."""

    def __init__(
        self, processes: int, *, timeout: float = CASE_TIMEOUT, tolerance: Tolerance = Tolerance(),
        first_case_factor: float = FIRST_CASE_FACTOR, startup: float = STARTUP_SECONDS, threads: int | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError(f"a worker pool needs at least one process, got {processes}")
        self.workers = [Worker(timeout=timeout, tolerance=tolerance, first_case_factor=first_case_factor, startup=startup,
                               threads=threads) for _ in range(processes)]
        self._order: deque[int] = deque()  # the process of each pending case, oldest first
        self._spec = ""  # the backend whose cases are pending

    @property
    def processes(self) -> int:
        return len(self.workers)

    @property
    def starts(self) -> int:
        return sum(worker.starts for worker in self.workers)

    @property
    def rejudged_changed(self) -> int:
        return sum(worker.rejudged_changed for worker in self.workers)

    @property
    def pending(self) -> int:
        return len(self._order)

    @property
    def pending_ids(self) -> list[str]:
        """The ids of the cases sent and not collected yet, oldest first."""
        each = [iter(worker.pending_ids) for worker in self.workers]
        return [next(each[index]) for index in self._order]

    def ensure(self, spec: str, capabilities: Any, deadline: float | None = None) -> None:
        """Every process alive with ``spec`` loaded: started and loaded side by side."""
        try:
            for worker in self.workers:
                worker.launch(spec)
            for worker in self.workers:
                worker.request_load(spec, capabilities, deadline)
            for worker in self.workers:
                worker.await_load(spec, deadline)
        except BaseException:
            for worker in self.workers:  # a start or a load still answering would be read by the next ensure
                if worker.in_flight:
                    worker.close(graceful=False)
            raise

    def case_limit(self, spec: str) -> float:
        return max(worker.case_limit(spec) for worker in self.workers)

    def submit(self, spec: str, capabilities: Any, case: Case, judge: CaseCheck, keep_output: bool,
               deadline: float | None = None, *, pass_errors: bool = True) -> float:
        """``Worker.submit`` to the process with the fewest cases pending (the first, on a tie)."""
        started = time.monotonic()
        if not self._order:
            self.ensure(spec, capabilities, deadline)
            self._spec = spec
        elif spec != self._spec:
            raise AssertionError(f"{spec} submitted while {self._spec}'s cases are pending")  # (as one Worker refuses it)
        index = min(range(len(self.workers)), key=lambda i: self.workers[i].pending)
        self.workers[index].submit(spec, capabilities, case, judge, keep_output, deadline, pass_errors=pass_errors)
        self._order.append(index)
        return time.monotonic() - started

    def collect(self, deadline: float | None = None) -> tuple[Outcome, float]:
        """``Worker.collect`` of the oldest case sent. A death or a hang in its process drops the cases sent
        to that process after the one in its kernel (``pending_ids``); the budget's end (``OutOfTime``)
        drops every pending case, in every process."""
        index = self._order[0]
        worker = self.workers[index]
        kept = worker.pending - 1
        try:
            got = worker.collect(deadline)
        except OutOfTime:
            self.close(graceful=False)
            raise
        except (OracleDisagreement, CaseError):  # the case's answer (the oracle's or the case's fault)
            self._collected(index, kept)
            raise
        except BaseException:  # an exchange may have been cut half-way: nothing pending can be trusted
            self.close(graceful=False)
            raise
        self._collected(index, kept)
        return got

    def _collected(self, index: int, kept: int) -> None:
        """The oldest case (of process ``index``) was answered; if that process now holds fewer than ``kept``
        cases, a death or a hang dropped its later ones: keep only the first it still holds."""
        self._order.popleft()
        left = self.workers[index].pending
        if left >= kept:
            return
        order: deque[int] = deque()
        for owner in self._order:
            if owner == index:
                if left == 0:
                    continue
                left -= 1
            order.append(owner)
        self._order = order

    def check(self, spec: str, capabilities: Any, case: Case, judge: CaseCheck, keep_output: bool,
              deadline: float | None = None, *, pass_errors: bool = True) -> tuple[Outcome, float]:
        """``Worker.check``: one case, judged alone."""
        if self._order:
            raise AssertionError("check() with cases still pending: collect them first")
        start_seconds = self.submit(spec, capabilities, case, judge, keep_output, deadline, pass_errors=pass_errors)
        outcome, _ = self.collect(deadline)
        return outcome, start_seconds

    def close(self, graceful: bool = True) -> None:
        for worker in self.workers:
            worker.close(graceful)
        self._order.clear()
