"""Building a run's planned kernel variants together, in processes of their own, while ready backends judge.

``Builds`` starts at most two processes for one command: one builds every ahead-of-time key
(``Backend.build_variants``: FlashInfer's JIT modules) of every backend side by side, ``parallel`` at a
time with the compiler jobs (``MAX_JOBS``) shared between them; the other warms up the keys of backends
with no ahead-of-time build (Triton, flex) by judging one drawn case per key, one after another, so that
the compile caches hold what a worker's first case of the key would compile. Each key is reported as its
build ends (``Build.seconds`` or ``Build.error``); a process that dies fails its keys still pending, and
``close`` stops what still runs (its whole process group: ninja and nvcc too). A build never runs in
a worker, so its time is never counted as judging.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queues
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pa_oracle.backends.base import Backend, CompileKey
from pa_oracle.fuzz.campaign.variants import draws_inside
from pa_oracle.fuzz.draw.strategies import Limits

SHARED: CompileKey = (("shared modules", True),)  # a task building what every key of a backend loads (build_shared)
SPARE_CORES = 4  # cores left to the campaign, its workers and draw processes while builds compile


@dataclass(frozen=True)
class BuildTask:
    """One key of one backend to build: ``spec`` loads the backend in the build process (as a worker loads it)."""

    index: int
    backend: str
    spec: str
    capabilities: Any
    key: CompileKey
    limits: Limits
    ahead: bool  # True: Backend.build_variants; False: warm up by judging one case inside the key
    at: int = 0  # the seed of the warm-up case


@dataclass
class Build:
    """What became of a ``BuildTask``: seconds it took, or the error that ended it."""

    task: BuildTask
    seconds: float = 0.0
    error: str | None = None
    warmed: bool = False  # built by judging one case inside the key (its caches hold it; a worker still loads it)


def warm_key(backend: Backend, key: CompileKey, limits: Limits, at: int) -> str | None:
    """Compile ``key`` by judging one case inside it; None, or why the key did not build (an error or crash)."""
    from pa_oracle.fuzz.run.runner import check_case

    outcome = check_case(backend, draws_inside(backend, key=key, limits=limits, count=1, at=at)[0])
    if outcome.status in ("error", "crash"):  # a verdict is no warm-up's business: a campaign judges and reports
        return f"{outcome.status}: {outcome.message.splitlines()[0][:200] if outcome.message else ''}"
    return None


def build_jobs(cores: int | None = None) -> int:
    """Compiler jobs for a run's builds: the cores but ``SPARE_CORES`` (all of them on a small machine)."""
    cores = cores or os.cpu_count() or 1
    return cores - SPARE_CORES if cores >= 2 * SPARE_CORES else cores


def parallel_builds(cores: int | None = None) -> int:
    """Keys built side by side (a FlashInfer module keeps a few compiler jobs busy, not 16)."""
    return max(1, build_jobs(cores) // 4)


def _build_process(tasks: list[BuildTask], answers: Any, parallel: int, jobs: int) -> None:
    """The build process: build ``tasks`` and put a ``Build`` for each on ``answers`` as it ends."""
    os.setsid()  # its own process group: ``Builds.close`` stops ninja and nvcc with it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the user's Ctrl-C is the campaign's to handle
    os.environ["MAX_JOBS"] = str(max(1, jobs // max(parallel, 1)))  # read by each ninja run (FlashInfer)
    from pa_oracle.fuzz.run.serve import _load_backend

    loaded: dict[str, Backend | BaseException] = {}
    for task in tasks:  # one at a time, before any thread: the registry discovers its adapters on first use
        if task.backend not in loaded:
            try:
                loaded[task.backend] = _load_backend(task.spec, task.capabilities)
            except BaseException as exc:  # noqa: BLE001 - reported with each of its keys
                loaded[task.backend] = exc
    warming = threading.Lock()  # warm-ups judge on the device: one at a time

    def build(task: BuildTask) -> None:
        start, warmed = time.monotonic(), False
        try:
            backend = loaded[task.backend]
            if isinstance(backend, BaseException):
                raise backend
            built = None
            if task.key == SHARED:
                backend.build_shared()
                built = [task.key]
            elif task.ahead:
                built = backend.build_variants([task.key])
            if built is None:  # no ahead-of-time build (or the adapter declined it): judge one case inside the key
                with warming:
                    warmed, error = True, warm_key(backend, task.key, task.limits, task.at)
            else:
                error = None if task.key in built else "the build ended without the module"
        except BaseException as exc:  # noqa: BLE001 - a failed build is reported, the others go on
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
        answers.put(Build(task, time.monotonic() - start, error, warmed))

    for task in tasks:
        if task.key == SHARED:
            build(task)  # what every key of its backend loads: before them
    ahead = [t for t in tasks if t.ahead and t.key != SHARED]
    with ThreadPoolExecutor(max_workers=max(parallel, 1)) as pool:
        list(pool.map(build, ahead))
    for task in tasks:
        if not task.ahead:
            build(task)  # one at a time: warm-ups judge on the device and compile with torch's own locks


class Builds:
    """The build processes of one command and what they reported (``on_build`` is called from a reader thread)."""

    def __init__(self, tasks: list[BuildTask], on_build: Callable[[Build], None], *, parallel: int | None = None,
                 jobs: int | None = None) -> None:
        self.tasks = tasks
        self.on_build = on_build
        self.parallel = parallel or parallel_builds()
        self.jobs = jobs or build_jobs()
        self.done: dict[int, Build] = {}
        self._processes: list[Any] = []
        self._answers: Any = None
        self._changed = threading.Condition()
        self._reader: threading.Thread | None = None
        self._closing = False

    @property
    def pending(self) -> list[BuildTask]:
        return [t for t in self.tasks if t.index not in self.done]

    def start(self) -> None:
        """Start the build processes (none when there is nothing to build)."""
        if not self.tasks:
            return
        context = multiprocessing.get_context("spawn")
        self._answers = context.Queue()
        groups = [[t for t in self.tasks if t.ahead], [t for t in self.tasks if not t.ahead]]
        for tasks in (g for g in groups if g):
            process = context.Process(target=_build_process, args=(tasks, self._answers, self.parallel, self.jobs),
                                      name="pa-oracle-build", daemon=True)
            process.start()
            self._processes.append((process, tasks))
        self._reader = threading.Thread(target=self._read, name="pa-oracle-build-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._closing:
            try:
                build = self._answers.get(timeout=0.2)
            except queues.Empty:
                if self._closing:
                    return  # (close() killed the processes: their keys are unfinished, not failed)
                if all(not p.is_alive() for p, _ in self._processes):
                    self._fail_dead()
                    if not self.pending:
                        return
                continue
            except (EOFError, OSError):
                return
            self._record(build)

    def _fail_dead(self) -> None:
        """Keys of a process that ended without reporting them failed (it crashed, or was killed)."""
        for process, tasks in self._processes:
            if process.is_alive():
                continue
            for task in tasks:
                if task.index not in self.done:
                    self._record(Build(task, 0.0, f"the build process ended (exit code {process.exitcode}) before this key"))

    def _record(self, build: Build) -> None:
        with self._changed:
            if build.task.index in self.done or (self._closing and build.error is not None):
                return
            self.done[build.task.index] = build
            self._changed.notify_all()
        self.on_build(build)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for another key to end; False if none ended (or none is pending)."""
        with self._changed:
            before = len(self.done)
            if not self.pending:
                return False
            self._changed.wait_for(lambda: len(self.done) > before or not self.pending, timeout=max(timeout, 0.0))
            return len(self.done) > before

    def close(self) -> list[BuildTask]:
        """Stop the builds still running (their process groups); the tasks that never ended."""
        unfinished = self.pending
        self._closing = True
        for process, _tasks in self._processes:
            if process.is_alive():
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    process.kill()
            process.join(timeout=5)
        if self._reader is not None:
            self._reader.join(timeout=2)
        return unfinished
