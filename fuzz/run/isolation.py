"""Run cases in a worker process, so a kernel that crashes the process (illegal memory access,
segfault, ``os._exit``, a poisoned CUDA context) or hangs becomes a finding and the campaign goes on.

The worker is restarted after a death or a timeout; the case that caused it is reported with
``status="crash"`` and the reason ("worker process died (signal SIGSEGV)", or "hang: no answer
after N s"). Timeouts: the worker's start (importing torch and the kernel library) has its own
allowance, the first case after a start gets ``first_case_factor`` times the case timeout (first
calls compile: Triton, FlashInfer JIT), every later case the case timeout. A check may be given a
shorter limit (what is left of the time budget); a case cut off by that limit alone is
``OutOfTime``, not a hang. The worker ignores SIGINT: the user's Ctrl-C stops the parent, and any
KeyboardInterrupt inside the worker is the kernel's own.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import multiprocessing as mp
import os
import pickle
import signal
import time
from multiprocessing.connection import Connection
from typing import Any, Literal, Protocol

from pa_oracle.fuzz.run.runner import ORACLE, ORACLE_CHECK, BadEngine, CaseCheck, OracleDisagreement, Outcome, engine_from_env, judge
from pa_oracle.oracle.tensors import make_tensors
from pa_oracle.fuzz.run.serve import NO_CASE, Request, serve, threads_from_env
from pa_oracle.oracle.case import Case, CaseError
from pa_oracle.oracle.errors import BadInput
from pa_oracle.oracle.tolerance import Tolerance, Verdict

STARTUP_SECONDS = 300.0  # importing torch and the kernel library; not part of a case's timeout
CASE_TIMEOUT = 300.0  # the default per-case limit (fuzz --case-timeout)
FIRST_CASE_FACTOR = 3.0  # the first case after a (re)start may compile kernels first
OUT_OF_TIME = "the time budget ran out"  # how an OutOfTime message starts


MAX_CASE_TIMEOUT = 86400.0  # a day: longer is no timeout (and 3x of 1e9 s overflows the pipe's wait)


class BadTimeout(BadInput):
    """A case timeout that is not a finite number of seconds > 0, at most ``MAX_CASE_TIMEOUT`` (bad input: exit 2)."""


class WorkerStartError(RuntimeError):
    """The worker process did not start (the backend failed to load there, or took too long)."""


class OutOfTime(Exception):
    """The time budget ran out while a case ran (within its case timeout): not a finding."""


def check_timeout(seconds: float) -> float:
    """``seconds`` if it is a usable case timeout (finite, > 0, at most ``MAX_CASE_TIMEOUT``); ``BadTimeout``
    otherwise (0 would make every case a false hang)."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds) or seconds <= 0:
        raise BadTimeout(f"the case timeout must be a finite number of seconds > 0, got {seconds!r}")
    if seconds > MAX_CASE_TIMEOUT:
        raise BadTimeout(f"the case timeout must be at most {MAX_CASE_TIMEOUT:g} seconds (a day), got {seconds!r}")
    return float(seconds)


def default_case_timeout() -> float:
    """The case timeout of replay and triage: ``PA_ORACLE_CASE_TIMEOUT`` seconds, else ``CASE_TIMEOUT``."""
    raw = os.environ.get("PA_ORACLE_CASE_TIMEOUT")
    if raw is None:
        return CASE_TIMEOUT
    try:
        return check_timeout(float(raw))
    except ValueError:
        raise BadTimeout(f"PA_ORACLE_CASE_TIMEOUT={raw!r}: give a finite number of seconds > 0") from None


_BAD_INPUT = {"CaseError": CaseError, "BadEngine": BadEngine}  # what the worker raised that is the user's input


@dataclasses.dataclass
class _Sent:
    """A case sent to the worker and not collected yet."""

    spec: str
    capabilities: Any
    case: Case
    check: CaseCheck
    keep_output: bool
    pass_errors: bool
    seq: int
    alone: bool = False  # judged again with no other case beside it
    first: str = ""  # with ``alone``: the status of its first answer
    answer: tuple[Outcome, float] | None = None  # known without the worker (a crash it was found to cause)
    raw: bool = False  # the worker returns the kernel's raw output and the verdict is made here (``_judged_here``)


class Worker:
    """One restartable worker process that judges the cases of any backend it is sent: a campaign
    keeps one per device, so the process start, the CUDA context and a library's import are paid
    once, not once per backend.

    A backend is loaded in it on its first case (within the ``startup`` allowance); the first case
    of each backend after a start gets ``first_case_factor`` times the case timeout (it may
    compile). After a crash outcome the process is restarted before another backend's case runs:
    a CUDA context a kernel left broken must not fail the next backend.

    The worker may judge several queued cases side by side, their kernels one at a time
    (``pa_oracle.fuzz.run.serve``; ``threads``: None for its default per device). A death or a hang
    then belongs to the case that was in its kernel, the cases queued before it are judged again in
    a fresh process, those after it dropped (as when one case at a time died). An answer other than
    a pass or a skip from a case judged beside another is not taken: that case is judged again alone,
    in a fresh process (``rejudged`` counts them, ``rejudged_changed`` those whose verdict changed).
    """

    def __init__(
        self, *, timeout: float = CASE_TIMEOUT, tolerance: Tolerance = Tolerance(),
        first_case_factor: float = FIRST_CASE_FACTOR, startup: float = STARTUP_SECONDS, threads: int | None = None,
    ) -> None:
        self.timeout = check_timeout(timeout)
        engine_from_env()  # a bad PA_ORACLE_ENGINE is refused before a process starts
        self.tolerance = tolerance
        self.first_case_factor = first_case_factor
        self.startup = startup
        self.threads = threads_from_env() if threads is None else threads
        self._ctx = mp.get_context("spawn")  # CUDA cannot be re-initialized in a forked child
        self._process: Any = None
        self._conn: Connection | None = None
        self._slot: Any = None  # the seq of the case in its kernel (shared with the process)
        self._seq = 0
        self._pending: collections.deque[_Sent] = collections.deque()  # sent, not collected
        self._loaded: set[str] = set()  # specs loaded in the current process
        self._judged: set[str] = set()  # specs that judged a case in the current process
        self._crashed: str | None = None  # the spec whose case crashed in the current process
        self._starting = False  # launched, its "ready" not received yet
        self._loading: str | None = None  # the spec it was asked to load, its answer not received yet
        self.starts = 0
        self.processes = 1  # (a ``WorkerPool`` has several)
        self.rejudged = 0
        self.rejudged_changed = 0

    def _launch(self) -> None:
        """Spawn the process; ``_ready`` waits for it to answer (so that several can start at once)."""
        parent, child = self._ctx.Pipe()
        self._slot = self._ctx.Value("q", NO_CASE, lock=False)
        self._process = self._ctx.Process(target=serve, args=(self.tolerance, child, self.threads, self._slot), daemon=True)
        self._process.start()
        child.close()  # the parent's copy: a dead worker then reads as EOF
        self._conn = parent
        self.starts += 1
        self._loaded, self._judged, self._crashed = set(), set(), None
        self._starting, self._loading = True, None

    def _ready(self, deadline: float | None) -> None:
        if self._starting:
            self._starting = False
            if self._receive(deadline, "start") != "ready":
                raise WorkerStartError("the worker answered its start with something other than ready")

    def _receive(self, deadline: float | None, what: str) -> Any:
        """The worker's next message within the startup allowance (or until ``deadline``), for
        ``what`` it is doing: "start" or the spec it loads."""
        assert self._conn is not None
        wait = self.startup if deadline is None else max(min(self.startup, deadline - time.monotonic()), 0.0)
        ended = False  # the process closed its end (it died), as against no answer within the wait
        try:
            raw = self._conn.recv_bytes() if self._conn.poll(wait) else None
        except (EOFError, OSError):
            raw, ended = None, True
        if raw is None:
            if ended:
                self._process.join(5)  # reaped, so that its exit code is known
            code = self._process.exitcode
            self.close(graceful=False)
            doing = "started" if what == "start" else f"loaded {what}"
            if wait < self.startup and code is None and not ended:
                raise OutOfTime(f"{OUT_OF_TIME} while the worker {doing}")
            raise WorkerStartError(f"the worker {'did not start' if what == 'start' else 'did not load ' + what} "
                                   f"within {self.startup:g} s (exit code {code})")
        return pickle.loads(raw)

    def ensure(self, spec: str, capabilities: Any, deadline: float | None = None) -> None:
        """A live process with ``spec`` loaded (``WorkerStartError`` if it cannot load there)."""
        self.launch(spec)
        self.request_load(spec, capabilities, deadline)
        self.await_load(spec, deadline)

    def launch(self, spec: str) -> None:
        """The first step of ``ensure``, which does not wait: a process started if none is alive (a fresh
        one if a crash of another backend's case may have broken this one's CUDA context)."""
        if self._crashed is not None and self._crashed != spec:
            self.close()
        if self._process is None or not self._process.is_alive():
            self._launch()

    def request_load(self, spec: str, capabilities: Any, deadline: float | None = None) -> None:
        """The second step of ``ensure``: wait until the process started, then ask it to load ``spec``."""
        self._ready(deadline)
        if self._loading is not None and self._loading != spec:  # an earlier load's answer: read it first
            try:
                self.await_load(self._loading, deadline)
            except WorkerStartError:
                if self._process is None:  # that load ended the process: a fresh one
                    self.launch(spec)
                    self._ready(deadline)
        if spec not in self._loaded and self._loading != spec:
            assert self._conn is not None
            self._conn.send_bytes(pickle.dumps(("load", spec, capabilities)))
            self._loading = spec

    def await_load(self, spec: str, deadline: float | None = None) -> None:
        """The last step of ``ensure``: wait until ``spec`` is loaded."""
        if self._loading != spec:
            return
        reply = self._receive(deadline, spec)  # (no answer: the process is closed, and ``_loading`` with it)
        self._loading = None  # only now: a wait cut short (Ctrl-C) leaves the answer unread, and says so
        if reply[0] != "loaded":
            raise WorkerStartError(f"the worker could not load {spec}: {reply[1]}")
        self._loaded.add(spec)

    def case_limit(self, spec: str) -> float:
        """The timeout of ``spec``'s next case: longer for its first case in this process."""
        return self.timeout * (1.0 if spec in self._judged else self.first_case_factor)

    def check(self, spec: str, capabilities: Any, case: Case, judge: CaseCheck, keep_output: bool,
              deadline: float | None = None, *, pass_errors: bool = True) -> tuple[Outcome, float]:
        """(the outcome of ``case`` judged by ``judge`` on backend ``spec``, seconds spent starting
        the process and loading the backend first). Within its case timeout, or until the monotonic
        ``deadline`` if that comes first (then a case still running is ``OutOfTime``)."""
        if self._pending:
            raise AssertionError("check() with cases still pending: collect them first")
        start_seconds = self.submit(spec, capabilities, case, judge, keep_output, deadline, pass_errors=pass_errors)
        outcome, _ = self.collect(deadline)
        return outcome, start_seconds

    @property
    def in_flight(self) -> bool:
        """Started or asked to load a backend, the answer not received yet (``launch``, ``request_load``)."""
        return self._starting or self._loading is not None

    @property
    def pending(self) -> int:
        """Cases submitted and not collected yet."""
        return len(self._pending)

    @property
    def pending_ids(self) -> list[str]:
        """The ids of the cases submitted and not collected yet, oldest first (a death or a hang drops the
        ones sent after the case in its kernel: they were not judged)."""
        return [sent.case.case_id for sent in self._pending]

    def submit(self, spec: str, capabilities: Any, case: Case, judge: CaseCheck, keep_output: bool,
               deadline: float | None = None, *, pass_errors: bool = True) -> float:
        """Send ``case`` to be judged after the cases already pending (the worker works through them
        while the caller does something else, e.g. draws the next cases); ``collect`` returns the
        outcomes in order. Returns the seconds spent starting the process and loading ``spec`` first.
        Pending cases are one backend's. A passing outcome carries its per-element errors
        (``Verdict.error``, ``lse_error``) only with ``keep_output`` or ``pass_errors``."""
        started = time.monotonic()
        if not self._pending:
            self.ensure(spec, capabilities, deadline)
        elif spec not in self._loaded:
            raise AssertionError(f"{spec} submitted while another backend's cases are pending")
        self._seq += 1
        self._send(_Sent(spec, capabilities, case, judge, keep_output, pass_errors, self._seq))
        return time.monotonic() - started

    def _send(self, sent: _Sent) -> None:
        assert self._conn is not None
        sent.raw = sent.check.name == ORACLE_CHECK and verdict_in_parent()  # the verdict is made here (``_judged_here``)
        request = Request(sent.spec, sent.case, sent.keep_output, sent.check, sent.pass_errors, sent.seq, sent.alone,
                          sent.raw)
        try:
            self._conn.send_bytes(pickle.dumps(request))
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # the process died: collect reports it as this (or an earlier) case's crash
        self._pending.append(sent)

    def collect(self, deadline: float | None = None) -> tuple[Outcome, float]:
        """(the outcome of the oldest pending case, the seconds the worker spent judging it). It gets
        its case timeout from now (so a caller busy elsewhere never causes a false hang), or until
        the monotonic ``deadline`` if that comes first (then ``OutOfTime``, and every pending case is
        dropped). A hang or a death of the process is the crash outcome of the case in its kernel
        (else of this one); the cases sent after that one are dropped (``pending`` is 0 then): they
        were not judged."""
        while True:
            got = self._collect_once(deadline)
            if got is not None:
                return got

    def _collect_once(self, deadline: float | None) -> tuple[Outcome, float] | None:
        """The oldest case's answer, or None when it was sent again (to a fresh process) instead."""
        sent = self._pending[0]
        if sent.answer is not None:
            self._pending.popleft()
            return sent.answer
        time_left = None if deadline is None else deadline - time.monotonic()
        limit = self.case_limit(sent.spec)
        budget_cut = time_left is not None and time_left < limit
        wait = max(time_left, 0.0) if budget_cut and time_left is not None else limit
        start = time.monotonic()
        assert self._conn is not None
        try:
            answered = self._conn.poll(wait)
            reply = pickle.loads(self._conn.recv_bytes()) if answered else None
        except (EOFError, ConnectionResetError, BrokenPipeError, OSError):
            return self._lost(self._died(), time.monotonic() - start, deadline)
        if reply is None:
            if budget_cut:
                self.close(graceful=False)
                raise OutOfTime(f"{OUT_OF_TIME} after {time.monotonic() - start:.1f} s of case {sent.case.case_id}")
            return self._lost(f"hang: no answer after {limit:g} s (worker restarted)", limit, deadline)
        self._judged.add(sent.spec)
        if reply[0] == "outcome" and sent.raw:  # (else the worker made the verdict: a CUDA machine)
            reply = (reply[0], _judged_here(sent, reply[1], self.tolerance), *reply[2:])
        overlapped = bool(reply[3] if reply[0] == "outcome" else reply[4])
        status = reply[1].status if reply[0] == "outcome" else f"raised {reply[1]}"
        if overlapped and status not in ("pass", "unsupported"):
            return self._again_alone(status, deadline)
        self._pending.popleft()
        if sent.alone:
            self.rejudged += 1
            self.rejudged_changed += status != sent.first
        if reply[0] == "outcome":
            if reply[1].status == "crash":
                self._crashed = sent.spec
            return reply[1], reply[2]
        kind, message, tb = reply[1:4]
        if kind == "OracleDisagreement":
            raise OracleDisagreement(message)
        if kind in _BAD_INPUT:
            raise _BAD_INPUT[kind](message)  # the case (or the oracle's setting) cannot be judged at all: bad input, not a kernel's fault
        failed = Outcome(sent.case, sent.spec, "error", f"the worker failed to judge the case: {kind}: {message}\n{tb}",
                         check=sent.check.name)
        return failed, time.monotonic() - start

    def _lost(self, why: str, seconds: float, deadline: float | None) -> tuple[Outcome, float] | None:
        """The process died or hung: the case in its kernel then (else the oldest) gets the crash
        outcome ``why``, the cases sent before it go to a fresh process, those after it are dropped."""
        in_kernel = NO_CASE if self._slot is None else self._slot.value
        self.close(graceful=False, keep_pending=True)
        at = next((i for i, sent in enumerate(self._pending) if sent.seq == in_kernel), 0)
        culprit, before = self._pending[at], list(self._pending)[:at]
        crash = Outcome(culprit.case, culprit.spec, "crash", why, check=culprit.check.name)
        self._pending.clear()
        if not before:
            return crash, seconds
        culprit.answer = (crash, seconds)
        if (failed := self._resend([*before, culprit], deadline)) is None:
            return None
        oldest = before[0]  # not the culprit: its answer cannot be the crash (the cases after it are dropped, not judged)
        why = (f"the worker died in case {culprit.case.case_id}'s kernel ({why}) and a fresh one did not start to judge "
               f"this case again: {failed}")
        return Outcome(oldest.case, oldest.spec, "error", why, check=oldest.check.name), seconds

    def _again_alone(self, status: str, deadline: float | None) -> tuple[Outcome, float] | None:
        """Judge the oldest case again alone in a fresh process (the ones after it as before); its
        first answer (``status``) was not a pass, with another case judged beside it."""
        waiting = list(self._pending)
        first = waiting[0] = dataclasses.replace(waiting[0], alone=True, first=status)
        self.close(graceful=False, keep_pending=True)
        self._pending.clear()
        if (failed := self._resend(waiting, deadline)) is None:
            return None
        why = f"the worker could not judge the case again alone: {failed}"
        return Outcome(first.case, first.spec, "error", why, check=first.check.name), 0.0

    def _resend(self, cases: list[_Sent], deadline: float | None) -> str | None:
        """Send ``cases`` to a fresh process, in order (one already answered is kept as it is); None,
        or why the process could not start or load their backend (then nothing is pending)."""
        try:
            self.ensure(cases[0].spec, cases[0].capabilities, deadline)
        except WorkerStartError as exc:
            return str(exc)
        for sent in cases:
            if sent.answer is None:
                self._seq += 1
                self._send(dataclasses.replace(sent, seq=self._seq))
            else:
                self._pending.append(sent)
        return None

    def _died(self) -> str:
        self._process.join(5)
        code = self._process.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            try:
                how = f"signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
        return f"worker process died ({how}) (worker restarted)"

    def close(self, graceful: bool = True, keep_pending: bool = False) -> None:
        if self._process is not None:
            if graceful and self._process.is_alive():
                try:
                    assert self._conn is not None
                    self._conn.send_bytes(pickle.dumps(None))
                except (BrokenPipeError, OSError):
                    pass
                self._process.join(2)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)
        if self._conn is not None:
            self._conn.close()
        self._process = None
        self._conn = None
        self._slot = None
        self._loaded, self._judged, self._crashed = set(), set(), None
        self._starting, self._loading = False, None
        if not keep_pending:
            self._pending.clear()  # not judged: their callers are told by ``pending`` dropping to 0


@functools.cache
def verdict_in_parent() -> bool:
    """Whether an isolated oracle case's verdict is made in this process (``_judged_here``): on a machine without
    CUDA. On a CUDA machine the worker still judges: the parent would compute every float64 reference and control
    on the host, where the worker computes them on the device (the fused engine, the controls' device rounding),
    which changes the tolerance's controls and the warm rate, and neither has been measured on a GPU yet."""
    import torch

    return not torch.cuda.is_available()


def _judged_here(sent: _Sent, outcome: Outcome, tolerance: Tolerance) -> Outcome:
    """An oracle case's outcome with the verdict made in this process: the reference and the controls
    computed here from the parent's own case and tolerance, compared with the kernel's raw output the
    worker returned (the worker compares nothing: ``Request.raw``). What the worker found counts only
    against the kernel (its failures are kept: a write to an input, a broken contract, a changed judge),
    so nothing the kernel changed in the worker's process (the judge's code, torch's numerics switches,
    the tolerance) can make it pass. Only for a case sent with ``raw`` (an oracle case, ``verdict_in_parent``)."""
    if outcome.status not in ("pass", "fail"):
        return outcome
    if outcome.output is None or outcome.verdict is None:
        if outcome.status == "fail":
            return outcome  # no well-formed output (a contract failure): nothing to compare here
        why = "the worker answered pass without the kernel's output (the judge's side of the worker was changed)"
        return dataclasses.replace(outcome, status="fail", message=f"FAIL: {why}", verdict=Verdict(False, [why]))
    try:
        verdict = judge(sent.case, make_tensors(sent.case, "cpu"), outcome.output, tolerance)
    except (OracleDisagreement, BadInput):  # the oracle's bug, the user's input: no verdict
        raise
    except Exception as exc:  # noqa: BLE001 - a well-formed output the oracle cannot judge: a tool failure
        return dataclasses.replace(outcome, status="error", verdict=None,
                                   message=f"the oracle could not judge the output: {type(exc).__name__}: {exc}")
    verdict.failures += [text for text in outcome.verdict.failures if text not in verdict.failures]
    verdict.passed = verdict.passed and outcome.verdict.passed
    if verdict.passed and not sent.pass_errors and not sent.keep_output:
        verdict.error = verdict.lse_error = None  # a pass counts by its statistics
    status: Literal["pass", "fail"] = "pass" if verdict.passed else "fail"
    kept = outcome.output if sent.keep_output or status == "fail" else None
    return dataclasses.replace(outcome, status=status, message=verdict.headline(), verdict=verdict, output=kept)


class Judges(Protocol):
    """What judges an ``IsolatedBackend``'s cases: a ``Worker``, or several (``pa_oracle.fuzz.run.pool.WorkerPool``)."""

    @property
    def processes(self) -> int: ...
    @property
    def starts(self) -> int: ...
    @property
    def rejudged_changed(self) -> int: ...
    @property
    def pending(self) -> int: ...
    @property
    def pending_ids(self) -> list[str]: ...
    def ensure(self, spec: str, capabilities: Any, deadline: float | None = None) -> None: ...
    def case_limit(self, spec: str) -> float: ...
    def submit(self, spec: str, capabilities: Any, case: Case, judge: CaseCheck, keep_output: bool,
               deadline: float | None = None, *, pass_errors: bool = True) -> float: ...
    def collect(self, deadline: float | None = None) -> tuple[Outcome, float]: ...
    def close(self, graceful: bool = True) -> None: ...


class IsolatedBackend:
    """A backend proxy whose ``check`` runs ``judge`` (default: the oracle comparison) in a
    restartable worker process: its own, or a shared ``worker`` (then ``close`` leaves it running
    for the other backends; its owner closes it).

    ``spec`` is a registered backend name or a ``MODULE:FUNCTION`` user kernel. A passing outcome
    comes back with its error statistics but without its per-element errors unless ``keep_output``
    or ``pass_errors`` (``pa_oracle.fuzz.run.judge.case_judge`` keeps them: a repro's report of a pass shows its worst elements).
    """

    def __init__(
        self, backend: Any, spec: str, *, timeout: float = CASE_TIMEOUT, tolerance: Tolerance = Tolerance(),
        first_case_factor: float = FIRST_CASE_FACTOR, startup: float = STARTUP_SECONDS, keep_output: bool = False,
        judge: CaseCheck = ORACLE, worker: Judges | None = None, pass_errors: bool = False,
    ) -> None:
        self.backend = backend
        self.spec = spec
        self.judge = judge
        self.keep_output = keep_output  # outcomes carry the kernel's output (``check_case``)
        # a passing outcome's per-element errors: only with keep_output or this (a campaign counts a pass by
        # its statistics; the errors cost a copy to the host and ~100 KB of pickle a case, and a reply over
        # the pipe's 64 KiB holds the worker until the parent reads it)
        self.pass_errors = pass_errors
        self._owns = worker is None
        self.worker: Judges = worker if worker is not None else Worker(
            timeout=timeout, tolerance=tolerance, first_case_factor=first_case_factor, startup=startup
        )
        self.start_seconds = 0.0  # spent starting the worker and loading this backend (all checks so far)

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def starts(self) -> int:
        return self.worker.starts

    def _start(self, deadline: float | None = None) -> None:
        self.worker.ensure(self.spec, self.backend.capabilities, deadline)

    def case_limit(self) -> float:
        """The timeout of the next case: longer for this backend's first case after a start."""
        return self.worker.case_limit(self.spec)

    def check(self, case: Case, deadline: float | None = None, judge: CaseCheck | None = None) -> Outcome:
        """Judge ``case`` with ``judge`` (default: this proxy's) in the worker within its case
        timeout, or until the monotonic ``deadline`` if that comes first (then a case still running
        is ``OutOfTime``). A check travels by name (``pa_oracle.fuzz.checks.base.Check.__reduce__``)."""
        if self.worker.pending:
            raise AssertionError("check() with cases still pending: collect them first")
        self.submit(case, deadline, judge)
        return self.collect(deadline)[0]

    @property
    def pending(self) -> int:
        return self.worker.pending

    @property
    def pending_ids(self) -> list[str]:
        return self.worker.pending_ids

    def submit(self, case: Case, deadline: float | None = None, judge: CaseCheck | None = None) -> None:
        """Queue ``case`` in the worker (``Worker.submit``); ``collect`` returns its outcome."""
        started = time.monotonic()
        try:
            self.start_seconds += self.worker.submit(self.spec, self.backend.capabilities, case, judge or self.judge,
                                                     self.keep_output, deadline, pass_errors=self.pass_errors)
        except (OutOfTime, WorkerStartError):
            self.start_seconds += time.monotonic() - started
            raise

    def collect(self, deadline: float | None = None) -> tuple[Outcome, float]:
        """(the oldest queued case's outcome, seconds the worker spent on it): ``Worker.collect``."""
        outcome, seconds = self.worker.collect(deadline)
        return (outcome if outcome.backend == self.name else dataclasses.replace(outcome, backend=self.name)), seconds

    def close(self, graceful: bool = True) -> None:
        if self._owns:
            self.worker.close(graceful)


def isolatable(backend: Any) -> str | None:
    """The spec a worker loads ``backend`` from, or None when it cannot (a user kernel that is not
    importable by its name, e.g. a function defined inside another)."""
    from pa_oracle.backends.user import UserKernel, load_kernel
    from pa_oracle.backends.writes import WriteBackend

    if isinstance(backend, WriteBackend):
        return backend.spec  # (a user's write kernel that does not import by its name fails to load there: a start error)
    if not isinstance(backend, UserKernel):
        return backend.name
    try:
        return backend.name if load_kernel(backend.name) is backend.fn else None
    except Exception:  # noqa: BLE001 - not importable by its name
        return None


def isolated_by_default(backend: Any) -> bool:
    """Crash isolation is the default for user kernels, backends of a native kernel library and
    anything on CUDA; pure-torch CPU backends (they cannot segfault or hang) run in-process."""
    from pa_oracle.backends.user import UserKernel
    from pa_oracle.backends.writes import WriteBackend

    if isinstance(backend, WriteBackend):  # likewise: a user's, a library's or a CUDA write kernel
        return backend.user or backend.library is not None or backend.device == "cuda"
    return isinstance(backend, UserKernel) or backend.package is not None or backend.device == "cuda"
