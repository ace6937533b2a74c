"""A campaign over KV-cache write kernels (``pa-oracle writes``): the write oracle's cases drawn in chunks
as the attention engine draws them (``run_chunk``: chunk ``j`` runs Hypothesis seed ``seed + j``), each
case judged byte for byte (``pa_oracle.fuzz.checks.append.judge_write``), the first failure shrunk and
saved, with isolation, budgets and resume.

Why not ``pa_oracle.fuzz.campaign.engine`` itself: its draws, worker protocol (``fuzz.run.serve``),
state (coverage, ledger predicates, variants) and finding writer are typed on the attention ``Case`` and
``Outcome``; a write case has neither. This module keeps the engine's meanings (chunks and their seeds,
a case drawn twice rejected, the state saved after each chunk and continued by ``--resume``, a finding
shrunk and published whole, the exit codes of ``pa_oracle.fuzz.exits.campaign_exit_code``) until the
engine takes a case kind (issue 32).

Isolation: each kernel's cases run in a worker process of its own (spawned), so a kernel that kills
the process (a segfault, ``os._exit``) or hangs past ``case_timeout`` is a "crash" or "hang" finding,
and the worker restarts; an exception of any kind is a "crash" finding in either mode.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from hypothesis import reject
from hypothesis.errors import Flaky, Unsatisfiable
from pa_oracle.backends.writes import WriteKernel
from pa_oracle.fuzz.campaign.drawers import run_chunk
from pa_oracle.fuzz.campaign.outdir import publish_folder
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.fuzz.checks.append import WriteOutcome, judge_write
from pa_oracle.fuzz.draw.appends import append_cases
from pa_oracle.fuzz.run.isolation import OUT_OF_TIME, STARTUP_SECONDS, check_timeout
from pa_oracle.oracle.append import AppendCase
from pa_oracle.oracle.errors import BadInput

CHUNK = 25  # examples per Hypothesis run, as the attention engine
STATE_FILE = "writes-state.json"
DIED = "the worker process died"


class WriteStateError(BadInput):
    """A write campaign's state that cannot be continued (exit 2), naming the file and field."""


def case_id(case: AppendCase) -> str:
    return hashlib.sha256(json.dumps(case.to_json(), sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class WriteResult:
    """One write kernel's campaign so far (what the state file holds per kernel). ``backend``, ``status``,
    ``examples``, ``findings``, ``notes`` and ``judged_nothing`` are what ``pa_oracle.fuzz.exits`` reads."""

    backend: str
    status: str = "pending"  # pending, running (the deadline came first), done, finding, incomplete
    examples: int = 0
    passed: int = 0
    chunks_done: int = 0
    seconds: float = 0.0
    seen: list[str] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)  # {case_id, status, detail, folder, repro}
    notes: list[str] = field(default_factory=list)

    def judged_nothing(self) -> str | None:
        return "no example ran" if self.examples == 0 and not self.findings else None

    def line(self) -> str:
        if self.findings:
            f = self.findings[-1]
            return f"{self.backend:28s} FAIL {f['status']} (after {self.examples} examples): {f['detail']}"
        if self.status == "incomplete":
            return f"{self.backend:28s} INCOMPLETE after {self.examples} examples: {self.notes[-1] if self.notes else ''}"
        budget = " (time budget)" if self.status == "running" else ""
        return f"{self.backend:28s} ok   {self.examples} examples{budget}, {self.seconds:.1f} s"


def _serve(conn: Any, spec: tuple[str, str]) -> None:
    """The worker process: load the kernel, then judge each case JSON sent, answering (status, detail)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the user's Ctrl-C stops the parent
    try:
        kernel = load_write_kernel(spec)
    except BaseException as exc:  # noqa: BLE001 - told to the parent, which stops
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", ""))
    while True:
        try:
            data = conn.recv()
        except EOFError:
            return
        case = AppendCase.from_json(data)
        try:
            outcome = judge_write(case, kernel)
            conn.send((outcome.status, outcome.detail))
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt ... of the kernel: a crash
            conn.send(("crash", f"{type(exc).__name__}: {exc} (raised by the kernel)"))


def load_write_kernel(spec: tuple[str, str]) -> WriteKernel:
    """("name", NAME) of the registry, or ("kernel", MODULE:NAME)."""
    from pa_oracle.backends.writes import get_write_kernel
    from pa_oracle.backends.writes.user import user_write_kernel

    kind, value = spec
    return get_write_kernel(value) if kind == "name" else user_write_kernel(value)


class WorkerStartError(RuntimeError):
    """The write kernel did not load in the worker process (a tool failure: no verdict)."""


class WriteWorker:
    """One restartable process judging one kernel's cases (``_serve``)."""

    def __init__(self, spec: tuple[str, str], timeout: float) -> None:
        self.spec, self.timeout = spec, check_timeout(timeout)
        self._ctx = mp.get_context("spawn")  # CUDA cannot be re-initialized in a forked child
        self._process: Any = None
        self._conn: Any = None

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._process = self._ctx.Process(target=_serve, args=(child, self.spec), daemon=True)
        self._process.start()
        child.close()
        self._conn = parent
        answer = self._conn.recv() if self._conn.poll(STARTUP_SECONDS) else ("error", f"no answer within {STARTUP_SECONDS:g} s")
        if answer[0] != "ready":
            self.close()
            raise WorkerStartError(f"the write kernel {self.spec[1]} did not load in its worker: {answer[1]}")

    def judge(self, case: AppendCase, cutoff: float | None) -> tuple[str, str]:
        """(status, detail); "crash" for a death, "hang" past the timeout; ``TimeoutError`` when ``cutoff``
        (the budget's end) came first."""
        if self._process is None or not self._process.is_alive():
            self._start()
        self._conn.send(case.to_json())
        wait = self.timeout if cutoff is None else min(self.timeout, max(cutoff - time.monotonic(), 0.0))
        try:
            if self._conn.poll(wait):
                return self._conn.recv()
        except (EOFError, OSError):
            self._process.join(5)
            code = self._process.exitcode
            self.close()
            how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            return "crash", f"{DIED} ({how}) while the kernel wrote (not shrunk: each step would restart the worker)"
        self.close()
        if wait < self.timeout:
            raise TimeoutError(f"{OUT_OF_TIME} while case {case_id(case)} ran")
        return "hang", f"hang: no answer after {self.timeout:g} s"

    def close(self) -> None:
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join(5)
        self._process = self._conn = None


@dataclass(frozen=True)
class WriteCampaign:
    """What a write campaign runs: the budgets, the seed, isolation and where findings go."""

    examples: int = 200
    seed: int = 0
    time_budget: float | None = None
    isolate: bool | None = None  # None: ``isolated_by_default`` per kernel
    case_timeout: float = 60.0
    out_dir: Path | None = None


def isolated_by_default(kernel: WriteKernel, spec: tuple[str, str]) -> bool:
    """On for a user's kernel, a library's kernel and a CUDA one; off for a pure-torch one on the CPU."""
    return spec[0] == "kernel" or kernel.package is not None or kernel.device() == "cuda"


class _Found(Exception):
    """A failing case: Hypothesis shrinks it."""


class _Stop(BaseException):
    """Ends a Hypothesis run at once, without shrinking (out of time, a hang, a worker that did not start)."""


def fuzz_write_kernel(kernel: WriteKernel, spec: tuple[str, str], config: WriteCampaign, result: WriteResult,
                      deadline: float | None, checkpoint: Callable[[], None] = lambda: None) -> WriteResult:
    """Run ``kernel`` until ``result`` counts ``config.examples`` cases, ``deadline`` passes or a finding."""
    isolate = isolated_by_default(kernel, spec) if config.isolate is None else config.isolate
    worker = WriteWorker(spec, config.case_timeout) if isolate else None
    seen, failing, stopped = set(result.seen), list[WriteOutcome](), list[str]()

    def judge(case: AppendCase) -> WriteOutcome:
        if worker is None:
            return judge_write(case, kernel)
        status, detail = worker.judge(case, deadline)
        return WriteOutcome(case, kernel.name, status, detail)

    def prop(case: AppendCase) -> None:
        searching = not failing
        if deadline is not None and time.monotonic() > deadline:
            stopped.append(OUT_OF_TIME)
            raise _Stop
        if searching:
            if case_id(case) in seen:
                reject()
            seen.add(case_id(case))
        try:
            outcome = judge(case)
        except (TimeoutError, WorkerStartError) as exc:
            stopped.append(str(exc))
            raise _Stop from None
        if searching:
            result.seen.append(case_id(case))
            result.examples += 1
            result.passed += outcome.ok
        if not outcome.ok:
            failing.append(outcome)
            if outcome.status == "hang" or DIED in outcome.detail:
                raise _Stop  # not shrunk: each step would cost a whole timeout, or a worker's restart
            raise _Found(outcome.detail)

    try:
        while result.examples < config.examples and (deadline is None or time.monotonic() < deadline):
            start, before = time.monotonic(), result.examples
            _run_one_chunk(kernel, config, result, prop)
            result.chunks_done += 1
            result.seconds += time.monotonic() - start
            cut = [s for s in stopped if not s.startswith(OUT_OF_TIME)]  # the budget's end, mid-case too, cuts nothing
            if failing:
                _record(result, failing[-1], spec, config.out_dir)
            elif cut:
                result.status, result.notes = "incomplete", result.notes + [cut[-1]]
            elif result.examples == before and not stopped:
                result.status = "incomplete"
                result.notes.append(f"the strategy drew no new case in chunk {result.chunks_done}")
            else:
                result.status = "done" if result.examples >= config.examples else "running"
            checkpoint()
            if result.status in ("finding", "incomplete"):
                break
    finally:
        if worker is not None:
            worker.close()
    return result


def _run_one_chunk(kernel: WriteKernel, config: WriteCampaign, result: WriteResult, prop: Callable[[AppendCase], None]) -> None:
    n = min(CHUNK, config.examples - result.examples)
    try:
        run_chunk(append_cases(kernel.capabilities), Shard(), config.seed, result.chunks_done, n, prop)
    except (Unsatisfiable, _Found, _Stop):
        pass
    except Flaky as exc:
        result.notes.append("the failure did not reproduce on replay (flaky kernel): " + str(exc)[:200])


def _record(result: WriteResult, outcome: WriteOutcome, spec: tuple[str, str], out_dir: Path | None) -> None:
    """The shrunk failing case as a finding: saved under ``out_dir`` (``writes.json``, replayable)."""
    result.status = "finding"
    finding: dict[str, Any] = {"case_id": case_id(outcome.case), "status": outcome.status,
                               "detail": outcome.detail.splitlines()[0] if outcome.detail else "", "folder": None, "repro": None}
    if out_dir is not None:
        folder = save_write_finding(out_dir, outcome, spec)
        finding["folder"] = str(folder)
        flag = "-b" if spec[0] == "name" else "--kernel"
        finding["repro"] = f"pa-oracle writes {flag} {spec[1]} --case {folder / 'writes.json'}"
    result.findings.append(finding)


def save_write_finding(out_dir: Path, outcome: WriteOutcome, spec: tuple[str, str]) -> Path:
    """A new folder ``NAME-CASEID`` under ``out_dir`` holding ``writes.json`` (never overwriting one)."""
    body = json.dumps({"kernel": outcome.kernel, "case": outcome.case.to_json(), "status": outcome.status,
                       "detail": outcome.detail}, indent=1, sort_keys=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in spec[1])

    def write(tmp: Path, _final: Path) -> None:
        (tmp / "writes.json").write_text(body + "\n")

    return publish_folder(out_dir, f"{safe}-{case_id(outcome.case)}", write)


def run_write_campaign(kernels: list[tuple[WriteKernel, tuple[str, str]]], config: WriteCampaign, state_file: Path | None,
                       resume: dict[str, WriteResult] | None = None,
                       progress: Callable[[str], None] = lambda line: None) -> list[WriteResult]:
    """Every kernel in turn (the time budget shared by those left); the state saved after each chunk."""
    results = dict(resume or {})
    for kernel, _spec in kernels:
        results.setdefault(kernel.name, WriteResult(kernel.name))

    def save() -> None:
        if state_file is not None:
            save_state(state_file, config, results)

    save()
    end = None if config.time_budget is None else time.monotonic() + config.time_budget
    for i, (kernel, spec) in enumerate(kernels):
        result = results[kernel.name]
        if result.findings or result.examples >= config.examples:
            continue  # settled: a finding, or its count reached
        left = len(kernels) - i
        deadline = None if end is None else time.monotonic() + max(end - time.monotonic(), 0.0) / left
        progress(f"fuzzing write kernel {kernel.name} on {kernel.device()} ...")
        fuzz_write_kernel(kernel, spec, config, result, deadline, save)
        progress(result.line())
    save()
    return [results[k.name] for k, _ in kernels]


def save_state(path: Path, config: WriteCampaign, results: dict[str, WriteResult]) -> None:
    data = {"kind": "writes", "config": {"seed": config.seed, "examples": config.examples},
            "results": {name: asdict(r) for name, r in results.items()}}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def load_state(path: Path, config: WriteCampaign) -> dict[str, WriteResult]:
    """The results of a saved write campaign to continue with ``config`` (same seed), strictly read."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise WriteStateError(f"{path}: cannot read a write campaign's state: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != "writes" or not isinstance(data.get("results"), dict):
        raise WriteStateError(f"{path}: not a write campaign's state (kind: {data.get('kind') if isinstance(data, dict) else None!r})")
    seed = data.get("config", {}).get("seed")
    if seed != config.seed:
        raise WriteStateError(f"{path}: config.seed is {seed!r}, this run's --seed is {config.seed}: it cannot continue it")
    try:
        return {name: WriteResult(**fields) for name, fields in data["results"].items()}
    except TypeError as exc:
        raise WriteStateError(f"{path}: results: {exc}") from None
