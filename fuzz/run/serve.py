"""The worker process of ``pa_oracle.fuzz.run.isolation``: loads backends, judges the cases it is sent
and answers each, in the order sent.

On an accelerator the host work of a judged case (drawing its tensors, the float64 oracle, two
controls, the comparison: ~400 torch operators) leaves the device idle most of the time, and torch's
operators release the GIL. So the worker judges the oracle check of an accelerator backend's cases in
``threads`` threads, its *kernel calls one at a time*, in the order sent: a case's ``plan``, its ``run``
and the device wait after it are one turn (``KernelLock``, ``KernelTurns``), so a kernel's fault surfaces
in its own case, never in another's oracle. While a case has its turn its number is in the shared
``in_kernel`` slot: when the process dies or hangs, the parent reads there which case was in its kernel
(``Worker.collect``). A case judged while another was being judged beside it says so in its answer
(``overlapped``): the parent trusts a pass, and judges anything else again alone in a fresh process
(another kernel's stray write cannot then be the cause). Every other case (other checks, CPU backends,
a case sent ``alone``) is judged with nothing beside it, drawing the next case's host tensors ahead
(``pa_oracle.fuzz.run.ahead``) as one thread did before.

``PA_ORACLE_JUDGE_THREADS=N`` sets the threads for every backend (1: one case at a time); unset,
``ACCELERATOR_THREADS`` for a backend on an accelerator and 1 on the CPU, whose judge already uses
every core through torch's own threads.
"""

from __future__ import annotations

import dataclasses
import importlib
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from multiprocessing.connection import Connection
from typing import Any

import torch
from pa_oracle.backends.base import Backend
from pa_oracle.fuzz.run import boundary
from pa_oracle.fuzz.run.runner import ORACLE_CHECK, WATCH, check_case, exception_text, finished
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.errors import BadInput, env_count
from pa_oracle.oracle.tensors import Tensors
from pa_oracle.oracle.tolerance import Tolerance

ACCELERATOR_THREADS = 2  # judge threads for an accelerator backend (measured on the H200: benchmarks/RESULTS.md)
NO_CASE = -1  # the in-kernel slot when no case is in a kernel


class BadThreads(BadInput):
    """``PA_ORACLE_JUDGE_THREADS`` is not a whole number >= 1 (bad input: exit 2)."""


def threads_from_env() -> int | None:
    """``PA_ORACLE_JUDGE_THREADS`` as a count, or None when unset (the default per device)."""
    return env_count("PA_ORACLE_JUDGE_THREADS", 1, BadThreads, "a whole number of threads >= 1")


def threads_for(backend: Any, threads: int | None) -> int:
    """The judge threads for ``backend``'s oracle cases: ``threads`` if given, else by its device."""
    if threads is not None:
        return threads
    return ACCELERATOR_THREADS if (getattr(backend, "device", None) or "cpu") != "cpu" else 1


@dataclasses.dataclass(frozen=True)
class Request:
    """One case to judge, as the parent sends it; ``seq`` numbers it for the in-kernel slot."""

    spec: str
    case: Case
    keep_output: bool
    check: Any
    pass_errors: bool
    seq: int
    alone: bool = False  # judge with no other case beside it (a second look at an overlapped finding)
    raw: bool = False  # the oracle check: run the kernel, return its output; the parent compares it (``check_case``'s elsewhere)


class KernelTurns:
    """One kernel at a time, in the order the cases were dispatched: case ``ticket`` enters its kernel only
    after every earlier ticket has left its kernel or finished without one (``leave``). Without the order a
    newer case could take the kernel first, and the oldest case's time, which the parent counts from its
    turn to answer, would include the other's kernel (a false hang)."""

    def __init__(self) -> None:
        self._turn = threading.Condition()
        self._next = 0
        self._serving = 0
        self._left: set[int] = set()

    def ticket(self) -> int:
        ticket, self._next = self._next, self._next + 1
        return ticket

    def enter(self, ticket: int) -> None:
        with self._turn:
            self._turn.wait_for(lambda: self._serving == ticket)

    def leave(self, ticket: int) -> None:
        with self._turn:
            self._left.add(ticket)
            while self._serving in self._left:
                self._left.discard(self._serving)
                self._serving += 1
            self._turn.notify_all()


class KernelLock:  # not a Backend subclass: its defaults would shadow the wrapped adapter's
    """``backend`` whose ``plan`` and the ``run`` after it (with the device wait that surfaces the
    kernel's asynchronous faults) are one turn of ``turns``, so two threads' kernels never interleave
    (an adapter's plan may fill buffers its run reads) and a fault lands in its own case. While in its
    turn, the in-kernel slot names the holder's case. The turn is left however ``check_case`` leaves a
    case (``release``: ``plan_inputs`` or the fingerprint raising between plan and run would otherwise
    keep it), and ``finish`` gives up the turn of a case that never took it (a skip). torch's numerics
    switches are put back before the turn ends (what the kernel changed is noted for its case's judge:
    ``boundary.end_turn``)."""

    in_turns = True  # ``check_case``: the judge's code and torch's switches are recorded and checked in the turn

    def __init__(self, backend: Backend, turns: KernelTurns, slot: Any, restore: Any) -> None:
        self.__dict__.update(_inner=backend, _turns=turns, _slot=slot, _restore=restore, _held=threading.local())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def judging(self, seq: int, ticket: int) -> None:
        """Name the case this thread judges next (``seq``: what the slot says in its turn) and its turn."""
        self._held.seq, self._held.ticket, self._held.locked, self._held.done = seq, ticket, False, False

    def plan(self, case: Case) -> Any:
        if self._held.done:
            raise RuntimeError("a case's kernel was planned twice in one judge (one turn a case)")
        self._turns.enter(self._held.ticket)
        self._held.locked = True
        boundary.begin_turn(WATCH)
        if self._slot is not None:
            self._slot.value = self._held.seq
        try:
            return self._inner.plan(case)
        except BaseException:
            self.release()
            raise

    def run(self, plan: Any, tensors: Tensors) -> Any:
        try:
            return finished(self._inner.run(plan, tensors), tensors.q.device)
        finally:
            self.release()

    def release(self) -> None:
        if getattr(self._held, "locked", False):
            try:
                self._restore()
            finally:
                if self._slot is not None:
                    self._slot.value = NO_CASE
                self._held.locked = False
                self.finish()

    def finish(self) -> None:
        """End this thread's turn (taken or not): the next case may enter its kernel."""
        if not getattr(self._held, "done", True):
            self._held.done = True
            self._turns.leave(self._held.ticket)


_WARM_OPS = (torch.exp, torch.log, torch.tanh, torch.sqrt, torch.sigmoid)
_WARM_ELEMENTS = (64, 1 << 17)  # one chunk (one thread), then enough for every intra-op thread


def warm_math() -> None:
    """Run torch's CPU math once in this thread before it judges: the vectorized transcendentals (MKL's
    VML behind ``torch.exp``, ``log``, ...) and a matmul, in float32 and float64, on one thread, then on
    all. Under CPU load, the first float32 ``torch.exp`` of a worker's judge thread (a correct kernel's
    softmax) now and then came out ~1e-4 relative off on the calling thread's share of the elements
    (half the heads: FAIL, 12x the allowed error), the same call repeated at once exact; torch's numerics
    switches were unchanged (5 in ~100 runs of the side-by-side crash test under 3 CPU burners, none
    in 70 after this). Where in torch or MKL the first call goes wrong is not known: no case is the first."""
    for dtype in (torch.float32, torch.float64):
        for n in _WARM_ELEMENTS:
            x = torch.linspace(0.5, 2.0, n, dtype=dtype)
            for op in _WARM_OPS:
                op(x)
            side = int(n ** 0.5) // 8 * 8 or 8
            torch.einsum("ij,jk->ik", x[: side * side].view(side, side), x[: side * side].view(side, side))


def _load_backend(spec: str, capabilities: Any) -> Any:
    from pa_oracle.backends import get_backend
    from pa_oracle.backends.user import UserKernel
    from pa_oracle.backends.writes import WRITE_SPEC, load_write_backend

    if spec.startswith(WRITE_SPEC):  # a write kernel (``WriteBackend.spec``): its own capabilities, its library imported
        writer = load_write_backend(spec)
        if writer.library is not None:
            importlib.import_module(writer.library)
        return writer
    backend = UserKernel.from_spec(spec) if ":" in spec else get_backend(spec)
    backend.capabilities = capabilities  # the parent's (narrowed by --only)
    if backend.package is not None:  # the library's import (seconds, once a process) is loading, not its first cases' judging
        importlib.import_module(backend.package)
    return backend


@dataclasses.dataclass(frozen=True)
class _Unreadable:
    """A request the worker could not unpickle (answered in its turn as the tool's failure)."""

    kind: str
    message: str


_GONE = object()  # the parent closed the pipe


def _parsed(raw: bytes) -> Any:
    try:
        return pickle.loads(raw)
    except Exception as exc:  # noqa: BLE001 - reported to the parent in the request's turn
        return _Unreadable(type(exc).__name__, exception_text(exc))


def _answered(payload: bytes) -> Future[bytes]:
    done: Future[bytes] = Future()
    done.set_result(payload)
    return done


class _Overlap:
    """Which cases were judged while another was being judged (their answers say ``overlapped``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: set[int] = set()
        self._overlapped: set[int] = set()

    def start(self, seq: int) -> None:
        with self._lock:
            self._active.add(seq)
            if len(self._active) > 1:
                self._overlapped |= self._active

    def end(self, seq: int) -> bool:
        with self._lock:
            self._active.discard(seq)
            if seq in self._overlapped:
                self._overlapped.discard(seq)
                return True
            return False


class _Server:
    def __init__(self, tolerance: Tolerance, conn: Connection, threads: int | None, slot: Any) -> None:
        self.tolerance, self.conn, self.threads, self.slot = tolerance, conn, threads, slot
        self.saved = boundary.judged_with(boundary.numerics())  # every case is judged with these
        WATCH.add([boundary])  # recorded with them
        self.backends: dict[str, Any] = {}
        self.locked: dict[str, KernelLock] = {}
        self.turns = KernelTurns()
        self.requests: queue.Queue[Any] = queue.Queue()  # filled by the receiver thread, in order
        self.answers: queue.Queue[Future[bytes] | None] = queue.Queue()  # sent by the sender thread, in order
        self.running: set[Future[bytes]] = set()  # cases being judged in the pool
        self.pool: ThreadPoolExecutor | None = None
        self.overlap = _Overlap()

    def receive(self) -> None:
        while True:
            try:
                raw = self.conn.recv_bytes()
            except (EOFError, OSError):
                self.requests.put(_GONE)  # the parent is gone
                return
            request = _parsed(raw)
            self.requests.put(request)
            if request is None:
                return

    def send(self) -> None:
        while (answer := self.answers.get()) is not None:
            try:
                payload = answer.result()
            except BaseException as exc:  # noqa: BLE001 - the tool failed outside the judge's own handler: say so in turn
                payload = pickle.dumps(("raised", type(exc).__name__, exception_text(exc), "", False))
            try:
                self.conn.send_bytes(payload)
            except (BrokenPipeError, OSError):
                return  # the parent is gone

    def serve(self) -> None:
        receiver = threading.Thread(target=self.receive, name="pa-oracle-receive", daemon=True)
        sender = threading.Thread(target=self.send, name="pa-oracle-send", daemon=True)
        receiver.start()
        sender.start()
        try:
            while (request := self.requests.get()) is not None and request is not _GONE:
                self.answers.put(self.dispatch(request))
        finally:
            self.idle()
            self.answers.put(None)
            sender.join()
            if self.pool is not None:
                self.pool.shutdown(wait=False)

    def idle(self) -> None:
        wait(self.running)
        self.running.clear()

    def dispatch(self, request: Any) -> Future[bytes]:
        if isinstance(request, _Unreadable):  # e.g. a check this worker cannot find: the tool's failure, not the kernel's
            return _answered(pickle.dumps(("raised", request.kind, request.message, "", False)))
        if isinstance(request, tuple) and request[0] == "load":
            self.idle()
            _, spec, capabilities = request
            try:
                self.backends[spec] = _load_backend(spec, capabilities)
                return _answered(pickle.dumps(("loaded",)))
            except BaseException as exc:  # noqa: BLE001 - the backend cannot load here: the parent says so
                return _answered(pickle.dumps(("load_failed", f"{type(exc).__name__}: {exception_text(exc)}")))
        backend = self.backends.get(request.spec)
        if self._pooled(request):
            threads = threads_for(backend, self.threads)
            while len(self.running) >= threads:
                done, _ = wait(self.running, return_when=FIRST_COMPLETED)
                self.running -= done
            if self.pool is None or self.pool._max_workers < threads:  # noqa: SLF001 - grown once, for the widest backend
                self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pa-oracle-judge", initializer=warm_math)
            future = self.pool.submit(self.judge, request, self._locked(request.spec, backend), self.turns.ticket())
            self.running.add(future)
            return future
        self.idle()
        return _answered(self.judge(request, backend))

    def _pooled(self, request: Request) -> bool:
        """Whether ``request`` is judged in the pool, beside others (else alone, in this thread)."""
        backend = self.backends.get(request.spec)
        return (backend is not None and not request.alone and request.check.name == ORACLE_CHECK
                and threads_for(backend, self.threads) > 1)

    def _locked(self, spec: str, backend: Any) -> KernelLock:
        if spec not in self.locked or self.locked[spec]._inner is not backend:  # noqa: SLF001
            self.locked[spec] = KernelLock(backend, self.turns, self.slot, lambda: boundary.end_turn(self.saved, WATCH))
        return self.locked[spec]

    def judge(self, request: Request, backend: Any, ticket: int = -1) -> bytes:
        """The pickled answer to ``request`` (judged in turn ``ticket`` of the kernel when ``backend`` is a
        ``KernelLock``): the outcome (every tensor on the CPU), or what the tool raised."""
        if isinstance(backend, KernelLock):
            backend.judging(request.seq, ticket)
        elif self.slot is not None:
            self.slot.value = request.seq
        self.overlap.start(request.seq)
        try:
            if backend is None:
                raise KeyError(f"{request.spec} was not loaded in this worker")
            boundary.restore_numerics(self.saved)  # one backend's import must not loosen another's controls
            start = time.monotonic()
            if request.raw:
                outcome = check_case(backend, request.case, self.tolerance, True, elsewhere=True)
            else:
                outcome = request.check.judge(request.case, backend, self.tolerance, request.keep_output)
            if outcome.status == "pass" and outcome.verdict is not None and not (request.keep_output or request.pass_errors):
                outcome.verdict.error = outcome.verdict.lse_error = None  # a pass counts by its statistics
            outcome = outcome.on_cpu()
            seconds = time.monotonic() - start
            overlapped = self.overlap.end(request.seq)
            # plain pickle: Connection.send would move every tensor to shared memory (torch's reducers), ~0.1 s a case
            return pickle.dumps(("outcome", outcome, seconds, overlapped))
        except BaseException as exc:  # noqa: BLE001 - the oracle failed, not the kernel: tell the parent
            overlapped = self.overlap.end(request.seq)
            tb = "".join(traceback.format_exception(exc, limit=-6))
            return pickle.dumps(("raised", type(exc).__name__, exception_text(exc), tb, overlapped))
        finally:
            if isinstance(backend, KernelLock):
                backend.release()
                backend.finish()
            elif self.slot is not None:
                self.slot.value = NO_CASE


def serve(tolerance: Tolerance, conn: Connection, threads: int | None = None, slot: Any = None) -> None:
    """The worker's main: answer ``"ready"``, then each request in its turn until the parent sends
    None or goes away. ``("load", spec, capabilities)`` loads a backend; a ``Request`` is judged with
    its check and the parent's tolerance; torch's numerics switches are restored before each case."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    boundary.in_worker()  # a kernel's os._exit ends this process: its death is the finding
    warm_math()  # this thread judges a case sent alone; each judge thread warms itself (the pool's initializer)
    conn.send_bytes(pickle.dumps("ready"))
    _Server(tolerance, conn, threads, slot).serve()


WATCH.add([sys.modules[__name__]])  # the worker's judging code: a kernel that rebinds it is named and it is put back
