"""Drawing a campaign's next chunks in helper processes, so that drawing scales with the host's cores.

A campaign process draws with Hypothesis at ~150 cases a second on one core (the H200 host), and with
half of a FlashInfer decode adapter's draws skipped as known findings that bounded its campaign to
~60-90 judged cases a second, whatever the worker could judge. Here ``PA_ORACLE_DRAW_PROCESSES``
helper processes draw the chunks after the one being judged; the campaign process only queues their
cases in the worker and collects the outcomes.

Verification model: chunk ``j`` is one Hypothesis run on its own seed, and what it draws depends only on
the strategy, the seed and which examples its test function rejects (a case drawn before in the
campaign; a known finding, ``KnownFindings``). A helper runs chunk ``j`` with the campaign's drawn set as
it stood when ``j`` was sent, and returns every example in order (``HelperDraw``). The engine takes that
draw only if each rejection is what its own run would decide now: no case of the draw was drawn since by
an earlier chunk (a case rejected as drawn before stays so: the set only grows), and, for a plan of
compile variants, the plan allows the same keys as when the chunk was sent (``Steering``: the same keys
steered the same way). Anything else (a clash, a helper that failed or
is not done by the time its chunk is needed) and the engine draws the chunk itself, as without helpers.
Same seed, same cases, same order, same counts.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hypothesis.errors import Unsatisfiable
from pa_oracle.backends.base import Capabilities
from pa_oracle.fuzz.campaign.ledger import Entry, known_finding
from pa_oracle.fuzz.campaign.chunks import chunk_test, run_chunk
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.fuzz.campaign.variants import Steering
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.errors import BadInput, env_count

ENV = "PA_ORACLE_DRAW_PROCESSES"
# the latest drawn cases sent with a chunk: a helper told fewer cases than were drawn can only draw one again, which
# the campaign sees (and draws that chunk itself): a bound on what each chunk pickles, not on what is exact. Hypothesis
# starts every chunk with the same few simplest cases: once one clashes it is sent with every later chunk
SENT_IDS = 5_000
MAX_DEFAULT = 3  # helpers by default: the cores past four (the campaign, its worker and its judge threads), at most this


class BadDrawProcesses(BadInput):
    """``PA_ORACLE_DRAW_PROCESSES`` is not a whole number >= 0 (bad input: exit 2)."""


def draw_processes(cores: int | None = None) -> int:
    """``PA_ORACLE_DRAW_PROCESSES`` if set (0: the campaign draws every chunk itself), else the ``cores``
    (default: the host's) past four, at most ``MAX_DEFAULT`` (0 on a 2-core CI machine)."""
    count = env_count(ENV, 0, BadDrawProcesses, "a whole number of draw processes >= 0 (0: none)")
    if count is None:
        cores = (os.cpu_count() or 1) if cores is None else cores
        return max(0, min(MAX_DEFAULT, cores - 4))
    return count


@dataclass(frozen=True)
class KnownFindings:
    """Whether a drawn case is a known finding of one backend at its versions (a ledger class), for one check."""

    ledger: tuple[Entry, ...]
    backend: str
    versions: tuple[tuple[str, str], ...]
    family: str | None
    check: str

    def __call__(self, case: Case) -> bool:
        return bool(self.ledger) and known_finding(list(self.ledger), case, self.backend, dict(self.versions),
                                                   self.family, self.check) is not None


@dataclass(frozen=True)
class DrawSpec:
    """What a helper needs to draw a backend's chunks as the engine does (every field pickles)."""

    capabilities: Capabilities
    limits: Limits
    steering: Steering | None  # None: no variant plan (the unrestricted strategy)
    known: KnownFindings
    shard: Shard
    base_seed: int

    def strategy(self) -> Any:
        if self.steering is None:
            return cases(self.capabilities, self.limits)
        return cases(self.capabilities, self.limits, variants=list(self.steering.keys), redirect=self.steering.redirect)


@dataclass
class HelperDraw:
    """Chunk ``index`` as a helper drew it: its examples in order, ``("known", case)`` or ``("new", case)``
    (a case the engine queues), and whether the run ended normally (False: it raised; the engine draws the
    chunk itself and meets what it raised)."""

    index: int
    events: list[tuple[str, Case]] = field(default_factory=list)
    complete: bool = True


def draw_in_helper(spec: DrawSpec, index: int, n: int, seen: frozenset[str]) -> HelperDraw:
    """Chunk ``index`` drawn as ``chunks.draw_chunk`` draws it (``chunk_test``), with no worker and no deadline."""
    draw = HelperDraw(index)
    test = chunk_test(seen, spec.known, draw.events, lambda case: draw.events.append(("new", case)))
    try:
        run_chunk(spec.strategy(), spec.shard, spec.base_seed, index, n,
                  lambda case: test(case.replace(seed=spec.shard.case_seed(case.seed))))
    except Unsatisfiable:
        pass  # every example was rejected
    except Exception:  # noqa: BLE001 - the engine's own run meets it and decides what it means
        draw.complete = False
    return draw


def _pair(spec: DrawSpec) -> tuple[str, str]:
    """The (backend, check) a spec draws for: what a campaign's drawn set belongs to."""
    return spec.known.backend, spec.known.check


def _ready() -> None:
    """A draw process's first task: it returns once the process has imported what drawing needs (this module)."""


def _leave_ctrl_c_to_the_campaign() -> None:
    """A helper ignores Ctrl-C (sent to the whole process group): the campaign stops, then shuts the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Drawers:
    """Up to ``count`` helper processes drawing chunks ahead (started by ``start`` or on first use, shared by a
    campaign's backends). A chunk not drawn yet when it is needed is waited for up to ``WAIT`` seconds once the helpers
    have answered (while they start, the engine draws itself rather than wait)."""

    WAIT = 2.0

    def __init__(self, count: int, first_wait: float = 0.0) -> None:
        self.count = count
        self.first_wait = first_wait  # the wait before any helper answered
        self._pool: ProcessPoolExecutor | None = None
        self._pending: dict[int, tuple[DrawSpec, int, Future[HelperDraw]]] = {}
        self.answered = False  # a helper has returned a draw (they are up)
        self.broken = False  # the pool failed: nothing more is sent
        self._clashed: dict[tuple[str, str], set[str]] = {}  # per (backend, check): drawn cases a helper drew again
        self.taken = self.redrawn = 0  # chunks taken from helpers; chunks the engine drew itself after a clash
        self._starting: list[Future[None]] = []

    @property
    def active(self) -> bool:
        return self.count > 0 and not self.broken

    def start(self) -> None:
        """Start the helpers now (a campaign's start, while its worker starts), so that they are up (spawned, imports
        done: seconds) by the first chunk they are sent, rather than have the first backend draw its chunks itself."""
        if self.active and self._pool is None:
            try:
                self._pool = self._new_pool()
                self._starting = [self._pool.submit(_ready) for _ in range(self.count)]
            except Exception:  # noqa: BLE001 - no process could start: the campaign draws every chunk itself
                self.broken = True

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.count, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_leave_ctrl_c_to_the_campaign)

    def _up(self) -> bool:
        """Whether the helpers answered: a draw was taken, or every start task returned."""
        if not self.answered and self._starting and all(f.done() and f.exception() is None for f in self._starting):
            self.answered = True
        return self.answered

    def send(self, spec: DrawSpec, index: int, n: int, seen: set[str]) -> None:
        """Have a helper draw chunk ``index`` (``n`` examples) given cases drawn so far: any of them (the latest
        ``SENT_IDS`` say), and those that clashed before (once per index). A pool that broke (a helper killed)
        draws nothing more: the campaign draws every chunk itself."""
        if index in self._pending or not self.active:
            return
        seen = seen | self._clashed.get(_pair(spec), set())
        try:
            if self._pool is None:
                self._pool = self._new_pool()
            self._pending[index] = (spec, n, self._pool.submit(draw_in_helper, spec, index, n, frozenset(seen)))
        except Exception:  # noqa: BLE001 - BrokenProcessPool, or no process could start
            self.broken = True

    def take(self, spec: DrawSpec, index: int, n: int, drawn: Callable[[str], bool]) -> HelperDraw | None:
        """Chunk ``index`` of ``n`` examples as a helper drew it for ``spec``; None (the engine then draws it
        itself) if it was not sent so, failed, is late, or holds a case ``drawn`` says an earlier chunk drew
        after it was sent (the engine's own run would reject that case, so its run could differ)."""
        sent = self._pending.pop(index, None)
        if sent is None or sent[:2] != (spec, n):
            return None
        future = sent[2]
        try:
            draw = future.result(timeout=self.WAIT if self._up() else self.first_wait)
        except Exception:  # noqa: BLE001 - late, or the helper died: the engine draws the chunk itself
            future.cancel()
            return None
        self.answered = True
        if not draw.complete:
            return None
        clashed = {case.case_id for _, case in draw.events if drawn(case.case_id)}
        if clashed:
            self._clashed.setdefault(_pair(spec), set()).update(clashed)  # sent with every later chunk of this pair
            self.redrawn += 1
            return None
        self.taken += 1
        return draw

    def forget(self) -> None:
        """Drop every chunk sent and not taken (another backend's turn begins)."""
        for *_, future in self._pending.values():
            future.cancel()
        self._pending.clear()

    def close(self) -> None:
        self.forget()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
