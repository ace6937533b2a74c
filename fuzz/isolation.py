"""Run cases in a worker process, so a kernel that crashes the process (illegal memory access,
segfault, a poisoned CUDA context) or hangs becomes a finding and the campaign goes on.

The worker is restarted after a death or a timeout; the case that caused it is reported with
``status="crash"`` and the reason (exit code or "no answer after N s").
"""

from __future__ import annotations

import multiprocessing as mp
import queue
from multiprocessing.connection import Connection
from typing import Any

from fuzz.runner import Outcome, check_case
from oracle.case import Case

_STARTUP_SECONDS = 300  # importing torch and the kernel library; not part of a case's timeout


def _load_backend(spec: str) -> Any:
    from backends.base import get_backend
    from backends.user import UserKernel

    return UserKernel.from_spec(spec) if ":" in spec else get_backend(spec)


def _serve(spec: str, capabilities: Any, conn: Connection) -> None:
    backend = _load_backend(spec)
    backend.capabilities = capabilities
    conn.send("ready")
    while True:
        case_json = conn.recv()
        if case_json is None:
            return
        outcome = check_case(backend, Case.from_json(case_json))
        if outcome.verdict is not None:
            outcome.verdict.error = outcome.verdict.error.cpu() if outcome.verdict.error is not None else None
        conn.send(outcome)


class IsolatedBackend:
    """A backend proxy whose ``check`` runs in a restartable worker process.

    ``spec`` is a registered backend name or a ``MODULE:FUNCTION`` user kernel.
    """

    def __init__(self, backend: Any, spec: str, *, timeout: float = 300.0) -> None:
        self.backend = backend
        self.spec = spec
        self.timeout = timeout
        self._ctx = mp.get_context("spawn")  # CUDA cannot be re-initialized in a forked child
        self._process: Any = None
        self._conn: Connection | None = None

    @property
    def name(self) -> str:
        return self.backend.name

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._process = self._ctx.Process(target=_serve, args=(self.spec, self.backend.capabilities, child), daemon=True)
        self._process.start()
        self._conn = parent
        if not parent.poll(_STARTUP_SECONDS) or parent.recv() != "ready":
            raise RuntimeError(f"the worker for {self.spec} did not start within {_STARTUP_SECONDS} s")

    def _restart(self) -> None:
        self.close()  # the next check starts a fresh worker

    def check(self, case: Case) -> Outcome:
        if self._process is None or not self._process.is_alive():
            self._start()
        assert self._conn is not None
        self._conn.send(case.to_json())
        try:
            if not self._conn.poll(self.timeout):
                raise queue.Empty
            return self._conn.recv()
        except queue.Empty:
            self._restart()
            return Outcome(case, self.name, "crash", f"hang: no answer after {self.timeout:g} s (worker restarted)")
        except (EOFError, ConnectionResetError, BrokenPipeError):
            self._process.join(5)
            code = self._process.exitcode
            self._restart()
            return Outcome(case, self.name, "crash", f"worker process died (exit code {code}) (worker restarted)")

    def close(self) -> None:
        if self._process is not None:
            if self._process.is_alive():
                try:
                    assert self._conn is not None
                    self._conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
                self._process.join(2)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)
        self._process = None
        self._conn = None
