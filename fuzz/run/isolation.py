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

import math
import multiprocessing as mp
import os
import pickle
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

from pa_oracle.fuzz.run.runner import ORACLE, Check, OracleDisagreement, Outcome, exception_text
from pa_oracle.oracle.case import Case, CaseError
from pa_oracle.oracle.tolerance import Tolerance

STARTUP_SECONDS = 300.0  # importing torch and the kernel library; not part of a case's timeout
CASE_TIMEOUT = 300.0  # the default per-case limit (fuzz --case-timeout)
FIRST_CASE_FACTOR = 3.0  # the first case after a (re)start may compile kernels first
OUT_OF_TIME = "the time budget ran out"  # how an OutOfTime message starts


class BadTimeout(ValueError):
    """A case timeout that is not a finite number of seconds > 0 (bad input: exit 2)."""


class WorkerStartError(RuntimeError):
    """The worker process did not start (the backend failed to load there, or took too long)."""


class OutOfTime(Exception):
    """The time budget ran out while a case ran (within its case timeout): not a finding."""


def check_timeout(seconds: float) -> float:
    """``seconds`` if it is a usable case timeout (finite, > 0); ``BadTimeout`` otherwise (0 would
    make every case a false hang)."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds) or seconds <= 0:
        raise BadTimeout(f"the case timeout must be a finite number of seconds > 0, got {seconds!r}")
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


def _load_backend(spec: str) -> Any:
    from pa_oracle.backends import get_backend
    from pa_oracle.backends.user import UserKernel

    return UserKernel.from_spec(spec) if ":" in spec else get_backend(spec)


def _serve(spec: str, capabilities: Any, tolerance: Tolerance, conn: Connection) -> None:
    """The worker: judge each case it is sent with the check sent along (the parent's tolerance)
    and send the outcome back with every tensor on the CPU (verdict, kernel output, derived cases).
    One worker serves every check of its backend."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    backend = _load_backend(spec)
    backend.capabilities = capabilities
    conn.send("ready")
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the parent is gone
        try:
            request = pickle.loads(raw)
        except Exception as exc:  # noqa: BLE001 - e.g. a check this worker cannot find: the tool's failure, not the kernel's
            conn.send_bytes(pickle.dumps(("raised", type(exc).__name__, exception_text(exc), "")))
            continue
        if request is None:
            return
        case_json, keep_output, check = request
        try:
            reply: Any = ("outcome", check.judge(Case.from_json(case_json), backend, tolerance, keep_output).on_cpu())
            payload = pickle.dumps(reply)
        except BaseException as exc:  # noqa: BLE001 - the oracle failed, not the kernel: tell the parent
            payload = pickle.dumps(("raised", type(exc).__name__, exception_text(exc), "".join(traceback.format_exception(exc, limit=-6))))
        # plain pickle: Connection.send would move every tensor to shared memory (torch's reducers), ~0.1 s a case
        conn.send_bytes(payload)


class IsolatedBackend:
    """A backend proxy whose ``check`` runs ``judge`` (default: the oracle comparison) in a
    restartable worker process.

    ``spec`` is a registered backend name or a ``MODULE:FUNCTION`` user kernel.
    """

    def __init__(
        self, backend: Any, spec: str, *, timeout: float = CASE_TIMEOUT, tolerance: Tolerance = Tolerance(),
        first_case_factor: float = FIRST_CASE_FACTOR, startup: float = STARTUP_SECONDS, keep_output: bool = False,
        judge: Check = ORACLE,
    ) -> None:
        self.backend = backend
        self.spec = spec
        self.judge = judge
        self.timeout = check_timeout(timeout)
        self.tolerance = tolerance
        self.first_case_factor = first_case_factor
        self.startup = startup
        self.keep_output = keep_output  # outcomes carry the kernel's output (``check_case``)
        self._ctx = mp.get_context("spawn")  # CUDA cannot be re-initialized in a forked child
        self._process: Any = None
        self._conn: Connection | None = None
        self._fresh = True  # the next case is the first after a start
        self.starts = 0

    @property
    def name(self) -> str:
        return self.backend.name

    def _start(self, deadline: float | None = None) -> None:
        parent, child = self._ctx.Pipe()
        args = (self.spec, self.backend.capabilities, self.tolerance, child)
        self._process = self._ctx.Process(target=_serve, args=args, daemon=True)
        self._process.start()
        child.close()  # the parent's copy: a dead worker then reads as EOF
        self._conn = parent
        self.starts += 1
        self._fresh = True
        wait = self.startup if deadline is None else max(min(self.startup, deadline - time.monotonic()), 0.0)
        try:
            ready = parent.poll(wait) and parent.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            code = self._process.exitcode
            self.close(graceful=False)
            if wait < self.startup and code is None:
                raise OutOfTime(f"{OUT_OF_TIME} while the worker for {self.spec} started")
            raise WorkerStartError(f"the worker for {self.spec} did not start within {self.startup:g} s (exit code {code})")

    def case_limit(self) -> float:
        """The timeout of the next case: longer for the first case after a start."""
        return self.timeout * (self.first_case_factor if self._fresh else 1.0)

    def check(self, case: Case, deadline: float | None = None, judge: Check | None = None) -> Outcome:
        """Judge ``case`` with ``judge`` (default: this proxy's) in the worker within its case
        timeout, or until the monotonic ``deadline`` if that comes first (then a case still running
        is ``OutOfTime``). A check travels by name (``pa_oracle.fuzz.checks.base.Check.__reduce__``)."""
        judge = judge if judge is not None else self.judge
        if self._process is None or not self._process.is_alive():
            self._start(deadline)
        assert self._conn is not None
        time_left = None if deadline is None else deadline - time.monotonic()
        limit = self.case_limit()
        budget_cut = time_left is not None and time_left < limit
        wait = max(time_left, 0.0) if budget_cut and time_left is not None else limit
        start = time.monotonic()
        try:
            self._conn.send_bytes(pickle.dumps((case.to_json(), self.keep_output, judge)))
            answered = self._conn.poll(wait)
            reply = pickle.loads(self._conn.recv_bytes()) if answered else None
        except (EOFError, ConnectionResetError, BrokenPipeError, OSError):
            return self._died(case, judge.name)
        if reply is None:
            self.close(graceful=False)  # the next check starts a fresh worker
            if budget_cut:
                raise OutOfTime(f"{OUT_OF_TIME} after {time.monotonic() - start:.1f} s of case {case.case_id}")
            return Outcome(case, self.name, "crash", f"hang: no answer after {limit:g} s (worker restarted)", check=judge.name)
        self._fresh = False
        if reply[0] == "outcome":
            return reply[1]
        _, kind, message, tb = reply
        if kind == "OracleDisagreement":
            raise OracleDisagreement(message)
        if kind == "CaseError":
            raise CaseError(message)  # the case cannot be judged at all: bad input, not a kernel's fault
        return Outcome(case, self.name, "error", f"the worker failed to judge the case: {kind}: {message}\n{tb}", check=judge.name)

    def _died(self, case: Case, check: str) -> Outcome:
        self._process.join(5)
        code = self._process.exitcode
        self.close()
        how = f"exit code {code}"
        if code is not None and code < 0:
            try:
                how = f"signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
        return Outcome(case, self.name, "crash", f"worker process died ({how}) (worker restarted)", check=check)

    def close(self, graceful: bool = True) -> None:
        if self._process is not None:
            if graceful and self._process.is_alive():
                try:
                    assert self._conn is not None
                    self._conn.send(None)
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
        self._fresh = True  # the next case is a new worker's first


def isolatable(backend: Any) -> str | None:
    """The spec a worker loads ``backend`` from, or None when it cannot (a user kernel that is not
    importable by its name, e.g. a function defined inside another)."""
    from pa_oracle.backends.user import UserKernel, load_kernel

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

    return isinstance(backend, UserKernel) or backend.package is not None or backend.device == "cuda"


@contextmanager
def case_judge(
    backend: Any, *, isolate: bool | None = None, timeout: float = CASE_TIMEOUT, tolerance: Tolerance = Tolerance(),
    first_case_factor: float = FIRST_CASE_FACTOR, keep_output: bool = False, judge: Check = ORACLE,
) -> Iterator[Callable[[Case], Outcome]]:
    """A function judging cases on ``backend`` with ``judge`` (default: the oracle comparison): in
    a worker process when ``isolate`` (default: ``isolated_by_default``) and the backend can be
    loaded there, else in this process. Used by replay, triage and the campaign engine, so a crash
    or hang finding replays as one."""
    spec = isolatable(backend) if (isolated_by_default(backend) if isolate is None else isolate) else None
    if spec is None:
        yield lambda case: judge.judge(case, backend, tolerance, keep_output)
        return
    worker = IsolatedBackend(
        backend, spec, timeout=timeout, tolerance=tolerance, first_case_factor=first_case_factor, keep_output=keep_output,
        judge=judge,
    )
    try:
        yield worker.check
    finally:
        worker.close()
