"""What a running campaign shows while it runs: per backend its phase (the first case, which
starts the worker and compiles the kernel; judging; shrinking a finding), the cases judged, the
rate and the findings. On a terminal a ``rich`` progress display that keeps ticking during a long
compile; elsewhere (CI logs, a pipe) the engine's own lines plus a heartbeat line every few seconds.

It listens to the campaign engine's two callbacks: ``progress`` (a line when a backend starts and
after every chunk) and ``on_case`` (after every judged case, also while shrinking).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

STARTING = "first case (worker start, compile)"
JUDGING = "judging"
SHRINKING = "shrinking a finding"
_START_LINE = re.compile(r"fuzzing (?P<backend>\S+) on (?P<device>.+?) \.\.\.(?: \(turn \d+\))?$")
_COMPILE_LINE = re.compile(r"compiling (?P<backend>\S+) (?P<variant>.+) \(its first case\) \.\.\.$")


@dataclass
class _Backend:
    """One backend's run as the display shows it."""

    name: str
    target: int
    phase: str = STARTING
    started: float = field(default_factory=time.monotonic)
    examples_at_start: int | None = None
    examples: int = 0
    findings: int = 0
    phase_started: float = field(default_factory=time.monotonic)

    def rate(self, now: float) -> float:
        judged = self.examples - (self.examples_at_start or 0)
        return judged / (now - self.started) if now > self.started else 0.0

    def set_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase, self.phase_started = phase, time.monotonic()

    def found(self) -> str:
        """The findings so far; while one is shrunk it is not recorded yet, and is said so ("0 finding(s)" beside
        "shrinking a finding" read as a contradiction)."""
        return f"{self.findings} finding(s)" + (" + 1 being shrunk" if self.phase == SHRINKING else "")

    def summary(self, now: float) -> str:
        phase = self.phase if self.phase in (JUDGING, SHRINKING) else f"{self.phase} {now - self.phase_started:.0f}s"
        return (f"{self.name}: {phase}, {self.examples}/{self.target} cases judged, {self.rate(now):.1f}/s, "
                f"{self.found()}, {now - self.started:.0f}s")


class CampaignProgress:
    """The progress of ``run_campaign``: pass ``progress=display.line, on_case=display.case`` and
    close it (or use it as a context manager) before printing the results. ``target`` is each
    backend's example count on this shard; ``live`` None: a rich display when stderr is a terminal."""

    def __init__(self, target: int, *, write: Callable[[str], None] | None = None, live: bool | None = None,
                 heartbeat: float = 5.0) -> None:
        self.target = target
        self.write = write or (lambda text: print(text, file=sys.stderr, flush=True))
        self.live = sys.stderr.isatty() if live is None else live
        self.heartbeat = heartbeat
        self.current: _Backend | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rich: Any = None
        self._task: Any = None
        if self.live:
            self._start_rich()
        elif heartbeat > 0:
            self._thread = threading.Thread(target=self._beat, name="pa-oracle-heartbeat", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ the engine's callbacks
    def line(self, text: str) -> None:
        """A line of the engine (``run_campaign(progress=...)``): printed; a start line opens a backend."""
        started = _START_LINE.search(text)
        compiling = _COMPILE_LINE.search(text)
        if started:
            self.current = _Backend(started["backend"], self.target)
        elif compiling and self.current is not None and self.current.name == compiling["backend"]:
            self.current.set_phase(f"compiling {compiling['variant']}")
        if self._rich is not None:
            self._rich.console.print(text, markup=False, highlight=False)
        else:
            self.write(text)
        self._refresh()

    def case(self, result: Any, searching: bool) -> None:
        """A judged case (``run_campaign(on_case=...)``): ``result`` is the backend's ``BackendResult``;
        ``searching`` False while Hypothesis shrinks a failure."""
        if self.current is None or self.current.name != result.backend:
            self.current = _Backend(result.backend, self.target)
        row = self.current
        if row.examples_at_start is None:
            row.examples_at_start = result.examples - 1 if searching else result.examples
        row.examples, row.findings = result.examples, len(result.findings)
        row.set_phase(JUDGING if searching else SHRINKING)
        self._refresh()

    # ------------------------------------------------------------------ rendering
    def _start_rich(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._rich = Progress(
            TextColumn("{task.fields[backend]}"), TextColumn("[cyan]{task.fields[phase]}"), BarColumn(),
            MofNCompleteColumn(), TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[findings]}"),
            TimeElapsedColumn(), console=Console(stderr=True), refresh_per_second=4,
        )
        self._rich.start()

    def _refresh(self) -> None:
        if self._rich is None or self.current is None:
            return
        row, now = self.current, time.monotonic()
        fields = {"backend": row.name, "phase": row.phase, "rate": f"{row.rate(now):.1f}/s",
                  "findings": row.found()}
        if self._task is None or self._rich.tasks[self._task].fields.get("backend") != row.name:
            if self._task is not None:
                self._rich.stop_task(self._task)
            self._task = self._rich.add_task("", total=row.target, **fields)
        self._rich.update(self._task, completed=row.examples, **fields)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            row = self.current
            if row is not None:
                self.write(f"  ... {row.summary(time.monotonic())}")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._rich is not None:
            self._rich.stop()
            self._rich = None

    def __enter__(self) -> CampaignProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
