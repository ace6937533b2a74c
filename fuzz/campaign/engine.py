"""The campaign engine: Hypothesis draws cases a backend supports, a check judges them (the
comparison with the oracle, ``pa_oracle.fuzz.run.runner.ORACLE``, or any check of
``pa_oracle.fuzz.checks.registry``), and the first finding per backend and check is shrunk to a
minimal case and saved (``pa_oracle.fuzz.campaign.findings``) with a repro command. Every check
gets the same isolation, resume, shards, ledger skip, budgets and coverage.

Verification model: examples run in chunks of ``CHUNK``, each chunk one Hypothesis run with its
own seed (``pa_oracle.fuzz.campaign.shard``). A case drawn before in the campaign (same case id) is rejected, so no
example runs twice; a case that a ledger entry's ``matches`` predicate covers is skipped as known,
so the campaign surfaces new findings. The state (``pa_oracle.fuzz.campaign.state``) is saved after a chunk
(``Checkpoints``: about every second, and at each turn's end and stop): ``run_campaign`` on that state continues at
the next chunk saved after a kill, drawing the same cases.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hypothesis import reject
from hypothesis.errors import Flaky, Unsatisfiable
from pa_oracle.backends.base import Backend, Capabilities
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.compile_plan import CompilePlan
from pa_oracle.fuzz.campaign.config import CampaignConfig, Hooks, Shared
from pa_oracle.fuzz.campaign.coverage import declared
from pa_oracle.fuzz.campaign.chunks import Chunk, campaign_settings, count_clean_chunk, draw_chunk, queue_drawn
from pa_oracle.fuzz.campaign.drawers import SENT_IDS, Drawers, DrawSpec, KnownFindings, draw_processes
from pa_oracle.fuzz.campaign.findings import publish_finding, publish_write_finding, save_finding, save_unjudged
from pa_oracle.fuzz.campaign.ledger import Entry
from pa_oracle.fuzz.campaign.minimize import fewer_requests
from pa_oracle.fuzz.campaign.schedule import Schedule
from pa_oracle.fuzz.campaign.state import BackendResult, CampaignState, Checkpoints, FindingRecord
from pa_oracle.fuzz.campaign.tally import count, settle_judged_nothing
from pa_oracle.fuzz.checks.append import is_write_case
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.run.isolation import OUT_OF_TIME, OutOfTime, WorkerStartError, isolatable
from pa_oracle.fuzz.run.judge import Judge, JudgeSettings, isolates, judge_for
from pa_oracle.fuzz.run.pool import worker_processes
from pa_oracle.fuzz.run.runner import ORACLE, CaseCheck, OracleDisagreement, Outcome
from pa_oracle.oracle.case import Case

CHUNK = 25  # examples per Hypothesis run; the time budget is checked and the state saved between runs

__all__ = ["CHUNK", "BackendResult", "BackendRun", "Campaign", "CampaignConfig", "Hooks", "Shared", "campaign_settings",
           "fuzz_backend", "judge_one", "run_campaign", "save_finding"]


class _Finding(Exception):
    pass


_TURN_OVER = "the deadline came before the next case"


class _Stop(BaseException):
    """Ends a Hypothesis run at once, without shrinking (Hypothesis passes BaseExceptions other than
    SystemExit and GeneratorExit through): out of time, a hang (each shrink step would cost a whole
    timeout) or an outcome the oracle could not judge."""


def fuzz_backend(
    backend: Backend,
    config: CampaignConfig = CampaignConfig(),
    *,
    check: CaseCheck = ORACLE,
    resume: BackendResult | None = None,
    shared: Shared | None = None,
    hooks: Hooks = Hooks(),
) -> BackendResult:
    """Run ``check`` (default: the comparison with the oracle) on one backend until it ran
    ``config.examples`` cases (counting those of ``resume``), ``shared.deadline`` passed (no case starts
    after it; an isolated case still running at ``shared.cutoff`` is cut off as out of time), or a
    finding. A check that cannot apply to the backend runs nothing (``result.not_applicable``).

    ``resume`` continues an earlier result at its next chunk; ``hooks.checkpoint`` is called with the result
    after every chunk. With ``config.ledger``, drawn cases that an entry covers are skipped. Isolated
    (``config.isolate``), every case runs in a worker process: a crash of the process or a case running
    longer than ``config.case_timeout`` seconds is a finding, and the worker restarts; a case still running
    at the deadline (but within its timeout) is out of time, not a finding. ``shared`` (``Shared``) holds
    what a campaign's pairs share: one worker process per device (the caller closes them; without them the
    backend's own worker is closed at the end), the draw processes (``pa_oracle.fuzz.campaign.drawers``: the
    same cases as without) and the pair's built variants. ``result.start_seconds`` and
    ``result.compile_seconds`` say how much of ``result.seconds`` went to starting workers (process, CUDA
    context, imports) and to compiling (the first case of each variant not built).

    The result's status is "done", "finding", "running" (the deadline came first), "exhausted" (the
    strategy drew nothing new) or "incomplete" with the reason in ``notes``: no example judged, a flaky
    failure that left no finding, a worker that did not start, or an internal error.
    ``result.is_complete`` says whether the run can be trusted as it is.
    """
    return BackendRun(backend, config, check=check, resume=resume, shared=shared or Shared(), hooks=hooks).run()


class BackendRun:
    """One (backend, check) pair's run, as ``fuzz_backend`` describes it. Its state is explicit: the
    result so far, the case ids drawn, the failures of the search (``failing``), why a Hypothesis run was
    ended (``stopped``) and the tool's own errors (``internal``)."""

    def __init__(self, backend: Backend, config: CampaignConfig, *, check: CaseCheck, resume: BackendResult | None,
                 shared: Shared, hooks: Hooks) -> None:
        self.backend, self.config, self.check, self.shared, self.hooks = backend, config, check, shared, hooks
        self.kernel_spec = _kernel_spec(backend)
        self.result = resume if resume is not None else BackendResult(backend.name, check=check.name)
        self.result.finding = self.result.finding_dir = self.result.repro = None  # this run's finding only
        self.seen = set(self.result.seen)
        self.failing: list[Outcome] = []
        self.stopped: list[str] = []  # why a Hypothesis run was ended by _Stop
        self.internal: list[Exception] = []  # errors of the tool itself while judging a case
        self.judge: Judge  # (``run`` chooses it: ``judge_for``)
        self.ahead: Chunk | None = None  # the next chunk, drawn (and queued) while the worker judged this one
        self.shrinking_since: float | None = None  # when the first shrink step of a finding ran

    def run(self) -> BackendResult:
        result, config = self.result, self.config
        capabilities = self.check.capabilities(self.backend)
        if isinstance(capabilities, str):
            result.not_applicable, result.status = capabilities, "done"
            if self.hooks.checkpoint:
                self.hooks.checkpoint(result)
            return result
        self.capabilities = capabilities
        result.declared = declared(capabilities, config.limits) if isinstance(capabilities, Capabilities) else {}
        versions = self.backend.versions() if config.ledger else {}
        self.is_known = _known_test(config.ledger, self.backend, self.check, versions)
        self.judge = self._judge_for()
        variants = self.shared.variants
        self.strategy = variants.strategy(config.limits) if variants is not None else _strategy(self.check, capabilities, config.limits)
        changed_before = self.judge.rejudged_changed
        try:
            # (a chunk drawn ahead is judged even past the deadline: it was drawn only when expected to finish by it)
            while result.examples < config.examples and (self.shared.deadline is None or self.ahead is not None
                                                          or time.monotonic() < self.shared.deadline):
                if self._one_chunk():
                    break
            if settle_judged_nothing(result) and self.hooks.checkpoint:
                self.hooks.checkpoint(result)
        except BaseException:
            self.judge.abandon()  # e.g. a Ctrl-C in the middle of an exchange with the worker
            raise
        finally:
            self._close(changed_before)
        return result

    def _judge_for(self) -> Judge:
        """How this pair's cases are judged (``judge_for``: in this process or in the device's shared worker),
        with the campaign's reason noted when a backend meant for a worker runs in this process."""
        config = self.config
        settings = JudgeSettings(config.isolate, config.case_timeout, config.tolerance, ahead=config.pipeline)
        judge = judge_for(self.backend, self.check, settings, self.shared.workers)
        if judge.note is not None:
            self.result.notes.append(judge.note)
        return judge

    def _close(self, changed_before: int) -> None:
        self.judge.discard(self.shared.stop_at)  # cases judged ahead and not counted: idle for the next backend
        if self.shared.drawers is not None:
            self.shared.drawers.forget()  # chunks drawn ahead and not taken: the next turn must not wait behind them
        if changed := self.judge.rejudged_changed - changed_before:
            self.result.notes.append(
                f"{changed} case(s) judged beside another gave a verdict other than a pass and another verdict "
                "judged again alone (the second is kept): a kernel whose result depends on what runs beside it, or flaky")
        self.judge.close()  # (a worker of its own; the campaign closes the shared ones)

    # -- judging one case

    def _judge(self, case: Case) -> Outcome:
        return self.judge.judge(case, self.shared.stop_at)

    def _prop(self, case: Case) -> None:
        """The Hypothesis test function of a chunk: judge ``case``; raise ``_Finding`` on a failure."""
        result, variants, deadline = self.result, self.shared.variants, self.shared.deadline
        searching = not self.failing  # False while Hypothesis shrinks a failure: nothing is counted then
        case = case.replace(seed=self.config.shard.case_seed(case.seed))
        judged_ahead = searching and self.judge.holds(case.case_id)
        if deadline is not None and time.monotonic() > deadline and not judged_ahead:
            self.stopped.append(_TURN_OVER if searching else "out of time while shrinking")
            raise _Stop  # at once (the finding so far is kept: a budget bounds shrinking too)
        if not searching and self._shrunk_long_enough():
            self.stopped.append("shrinking stopped after config.shrink_seconds")
            raise _Stop
        if searching:
            if case.case_id in self.seen:
                reject()  # drawn before in this campaign (Hypothesis starts every run at the simplest case)
            self.seen.add(case.case_id)
            result.seen.append(case.case_id)
        if self.is_known(case):
            if searching:
                result.skipped_known += 1
            reject()  # also while shrinking, so that a new failure does not shrink into a known one
        outcome = self._judge_counted(case, searching, announce=variants is not None and searching and not judged_ahead)
        if outcome.status == "error":
            if not searching:
                reject()  # a shrink candidate the oracle cannot judge is no smaller failure
            self.stopped.append(f"the oracle could not judge case {case.case_id} ({case.summary()})"
                                f"{_saved_at(outcome, self.backend, self.config.out_dir, self.kernel_spec)}: {outcome.message}")
            raise _Stop
        if searching:
            count(result, outcome)
        if self.hooks.on_case:
            self.hooks.on_case(result, searching)
        if outcome.is_finding:
            self.failing.append(outcome)
            if outcome.message.startswith("hang:"):
                raise _Stop  # shrinking a hang costs a whole timeout per step
            raise _Finding(outcome.message)

    def _shrunk_long_enough(self) -> bool:
        """Whether ``config.shrink_seconds`` have passed since the finding's first shrink step (None: never)."""
        if self.config.shrink_seconds is None:
            return False
        now = time.monotonic()
        if self.shrinking_since is None:
            self.shrinking_since = now
        return now - self.shrinking_since > self.config.shrink_seconds

    def _judge_counted(self, case: Case, searching: bool, *, announce: bool) -> Outcome:
        """Judge ``case`` (``announce``: tell the variant plan first), counting the worker's start and the
        variant's compile; ``_Stop`` when it could not be judged."""
        result, variants = self.result, self.shared.variants
        starting = self.judge.start_seconds
        if announce and variants is not None:
            variants.before(case)
        try:
            judging = time.monotonic()
            outcome, ahead_seconds = self.judge.outcome(case, self.shared.stop_at)
            started = self.judge.start_seconds - starting
            result.start_seconds += started
            if variants is not None and searching:
                took = ahead_seconds if ahead_seconds is not None else time.monotonic() - judging - started
                result.compile_seconds += variants.observe(case, took)
            return outcome
        except (OutOfTime, WorkerStartError) as exc:
            result.start_seconds += self.judge.start_seconds - starting
            self.stopped.append(str(exc))
            if searching:
                result.seen.pop()  # not judged: a resume draws it again
            raise _Stop from None
        except Exception as exc:  # noqa: BLE001 - the tool failed (not the kernel): Hypothesis must not shrink it
            self.internal.append(exc)
            self.stopped.append(f"internal error: {type(exc).__name__}: {exc}")
            raise _Stop from None

    # -- one chunk

    def _chunk(self, index: int, n: int) -> Chunk:
        """Chunk ``index`` of ``n`` examples, not drawn yet."""
        return Chunk(index, n, self.config.shard, self.config.seed)

    def _one_chunk(self) -> bool:
        """Run the next chunk and settle the result's status; True when the pair stops here. A judge that works
        while this process draws (``judge.ahead``) gets the chunk drawn ahead and counts it if every case passed
        (``_draw_ahead``); otherwise, or when anything else happened, the chunk's own Hypothesis run judges it
        case by case (``_prop``), taking the outcomes judged ahead."""
        result, config = self.result, self.config
        n = min(CHUNK, config.examples - result.examples)
        before, chunk_start = result.examples, time.monotonic()
        run_it, broke = self._pipelined(n) if self.judge.ahead else (True, None)
        try:
            if run_it:
                self._chunk(result.chunks_done, n).run(self.strategy, self._prop)
        except Unsatisfiable:
            pass  # every example of the chunk was rejected (out of time, or all drawn before)
        except _Finding:
            pass
        except _Stop:
            if self.internal and isinstance(self.internal[-1], OracleDisagreement):
                raise self.internal[-1] from None  # a bug of the oracle itself: the run fails (exit 3)
            broke = self.stopped[-1] if self.stopped and not self.failing else None
            if broke == _TURN_OVER:
                broke = None  # the deadline came between two cases: nothing was cut
        except Flaky as exc:
            result.notes.append("the failure did not reproduce on replay (flaky kernel): " + str(exc)[:200])
            broke = None if self.failing else "Hypothesis reported a flaky test without a finding"
        except Exception as exc:  # noqa: BLE001 - an internal error: the backend stops, the campaign goes on
            broke = f"internal error: {type(exc).__name__}: {exc}"
        return self._settle(before, chunk_start, broke)

    def _pipelined(self, n: int) -> tuple[bool, str | None]:
        """Take (or draw) this chunk drawn ahead and queued in the judge, draw the next one while the judge works
        on it, and count it if every case passed: (whether the engine's own run must judge the chunk, why the
        chunk broke off)."""
        result, judge = self.result, self.judge
        index, rest = result.chunks_done, self.config.examples - result.examples - n
        ahead, self.ahead = self.ahead, None
        chunk = ahead if ahead is not None and ahead.index == index else self._draw_ahead(self._chunk(index, n), set(), rest)
        if chunk.complete and rest > 0 and judge.will_finish_by(min(CHUNK, rest), self.shared.deadline):
            nxt = self._chunk(index + 1, min(CHUNK, rest))
            self.ahead = self._draw_ahead(nxt, chunk.ids, rest - nxt.size)  # while the judge works on `chunk`
        # every case passed (or was unsupported): counted as drawn; else the engine's own run
        # judges the chunk (shrinking included), taking the outcomes judged so far
        counted, broke = count_clean_chunk(result, chunk, judge, self.seen, self.shared.variants, self.hooks.on_case,
                                           self.shared.stop_at) if chunk.complete else (False, None)
        if chunk.error is not None and not chunk.queued:
            counted, broke = True, chunk.error  # the worker did not start (or the budget ran out first), as in _prop
        return not counted, broke

    def _draw_spec(self) -> DrawSpec:
        """How a helper process draws this backend's chunks now (the plan's allowed keys as they are)."""
        variants = self.shared.variants
        steering = variants.steering() if variants is not None else None
        return DrawSpec(self.backend.capabilities if variants is not None else self.capabilities, self.config.limits,
                        steering, self.is_known, self.config.shard, self.config.seed)

    def _draw_ahead(self, chunk: Chunk, also_seen: set[str], after: int) -> Chunk:
        """Draw ``chunk`` (a helper's draw if one drew it and it is the engine's, else here) and queue its cases
        in the judge (``pa_oracle.fuzz.campaign.chunks``); then send the next chunks to the helpers (``after``:
        the examples left after this chunk)."""
        index, deadline, stop_at = chunk.index, self.shared.deadline, self.shared.stop_at
        starting = self.judge.start_seconds
        announce = self.shared.variants.before if self.shared.variants is not None else None
        drawers = self.shared.drawers
        helpers = drawers if drawers is not None and drawers.active else None
        spec = self._draw_spec() if helpers is not None else None
        helped = None
        if helpers is not None and spec is not None:
            helped = helpers.take(spec, index, chunk.size, lambda case_id: case_id in self.seen or case_id in also_seen)
        if helped is not None:
            queue_drawn(chunk, helped.events, self.judge, deadline=deadline, cutoff=stop_at, announce=announce)
        else:
            draw_chunk(chunk, self.strategy, self.seen | also_seen, self.is_known, self.judge, deadline=deadline,
                       cutoff=stop_at, announce=announce)
        if helpers is not None and spec is not None and chunk.complete:
            drawn = set(self.result.seen[-SENT_IDS:]) | also_seen | chunk.ids
            for j in range(1, helpers.count + 1):
                if (size := min(CHUNK, after - CHUNK * (j - 1))) > 0:
                    helpers.send(spec, index + j, size, drawn)
        self.result.start_seconds += self.judge.start_seconds - starting
        return chunk

    def _settle(self, before: int, chunk_start: float, broke: str | None) -> bool:
        """After a chunk: its time, its note, the result's status, the finding saved, the hooks told;
        True when the pair stops here."""
        result, deadline = self.result, self.shared.deadline
        result.chunks_done += 1
        result.seconds += time.monotonic() - chunk_start
        # cases judged side by side can each count one compile: the split never gives judging less than nothing
        result.compile_seconds = min(result.compile_seconds, max(result.seconds - result.start_seconds, 0.0))
        out_of_time = deadline is not None and time.monotonic() > deadline
        if broke is not None:
            result.notes.append(broke)
        if self.failing:
            result.status = "finding"
            first = self.failing[0]  # the first failing case of the search, kept beside the minimal one
            if not is_write_case(self.failing[-1].case):  # (a write case has no requests to drop, no attention features)
                self.failing[-1] = fewer_requests(self.failing[-1], self._judge, self.is_known)
                result.coverage.add(self.failing[-1].case)  # the minimal case was judged too (while shrinking): its features ran
            _record_finding(result, self.failing[-1], self.backend, self.config.out_dir, self.kernel_spec, first=first)
        elif broke is not None and not broke.startswith(OUT_OF_TIME):
            result.status = "incomplete"
        elif result.examples == before and not out_of_time and broke is None:
            result.status = "exhausted"  # the strategy drew nothing new: not complete either
            result.notes.append(f"the strategy drew no new case in chunk {result.chunks_done}")
        else:
            result.status = "done" if result.examples >= self.config.examples else "running"
        if self.hooks.checkpoint:
            self.hooks.checkpoint(result)
        if self.hooks.progress:
            self.hooks.progress(result)
        return result.status in ("finding", "incomplete", "exhausted")


def _strategy(check: CaseCheck, capabilities: Any, limits: Limits) -> Any:
    """What a pair draws: the check's own strategy if it has one (the write check's write cases), else attention
    cases within ``capabilities``."""
    own = getattr(check, "strategy", None)
    return own(capabilities, limits) if own is not None else cases(capabilities, limits)


def _kernel_spec(backend: Backend) -> str | None:
    """What a repro command imports for ``backend``: a user kernel's MODULE:NAME (a registered backend: None)."""
    return backend.name if isinstance(backend, UserKernel) else None


def _saved_at(outcome: Outcome, backend: Backend, out_dir: Path | None, kernel_spec: str | None) -> str:
    """Where a case the oracle could not judge was saved (``save_unjudged``), or why it was not, as a
    clause of the note: saving it is a courtesy, the tool error is what the campaign reports."""
    if out_dir is None:
        return ""
    spec = kernel_spec or (backend.name if isinstance(backend, UserKernel) else None)
    try:
        return f" (saved in {save_unjudged(outcome, backend, out_dir, spec)})"
    except Exception as exc:  # noqa: BLE001 - never turn the tool error into another failure
        return f" (not saved under {out_dir}: {type(exc).__name__}: {exc})"


def _record_finding(
    result: BackendResult, outcome: Outcome, backend: Backend, out_dir: Path | None, kernel_spec: str | None,
    first: Outcome | None = None,
) -> None:
    result.finding = outcome
    result.finding_dir = result.repro = None
    case_id = outcome.case.case_id
    if out_dir is not None and is_write_case(outcome.case):
        result.finding_dir, result.repro = publish_write_finding(outcome, backend, out_dir)
    elif out_dir is not None:
        result.finding_dir, case_id, result.repro = publish_finding(outcome, backend, out_dir, kernel_spec, first=first)
    result.findings.append(
        FindingRecord(
            case_id, outcome.status, outcome.message.splitlines()[0] if outcome.message else "",
            outcome.case.summary(), str(result.finding_dir) if result.finding_dir else None, result.repro, outcome.check,
        )
    )


def run_campaign(
    backends: list[Backend],
    state: CampaignState,
    state_file: Path,
    config: CampaignConfig = CampaignConfig(),
    *,
    progress: Callable[[str], None] | None = None,
    on_case: Callable[[BackendResult, bool], None] | None = None,
    compile_plan: CompilePlan | None = None,
) -> list[BackendResult]:
    """Run every check of ``config.checks`` on ``backends``, one (backend, check) pair after another, on
    ``config.shard``, continuing ``state`` (whose seed wins over ``config.seed``: a resumed campaign draws
    its own cases) and saving it to ``state_file`` (``Checkpoints``). ``config.examples`` is the campaign's
    total per pair (this shard runs its share); the time budget is shared by the pairs that still have
    work (each turn gets an equal share of what is left, so time one pair did not use goes to the others;
    a pair the deadline stopped gets another turn while time is left) and bounds a hanging case too. A
    pair whose variants are still building (``compile_plan``) gives its place to the next and waits only
    when no other pair is left; that wait counts as its compile time. One worker process per device serves
    every isolated pair. A pair that stopped at a finding runs again only with ``config.rerun_findings``.
    ``compile_plan`` (``pa_oracle.fuzz.campaign.compile_plan``, made from ``config.compile_budget`` seconds
    when not given): each backend draws inside its built variants, the planned ones built together in the
    background while ready pairs judge; None (no budget) draws without that restriction. ``progress`` is
    told each line of the run, ``on_case`` each judged case."""
    config = config.replace(seed=int(state.config.get("seed", config.seed)))
    return Campaign(backends, state, state_file, config, progress=progress, on_case=on_case,
                    compile_plan=compile_plan).run()


class Campaign:
    """One run of ``run_campaign``: the pairs, their turns, and what they share (a worker per device, the
    draw processes, the compile plan)."""

    def __init__(self, backends: list[Backend], state: CampaignState, state_file: Path, config: CampaignConfig, *,
                 progress: Callable[[str], None] | None, on_case: Callable[[BackendResult, bool], None] | None,
                 compile_plan: CompilePlan | None) -> None:
        self.state, self.config, self.progress, self.compile_plan = state, config, progress, compile_plan
        self.target = config.shard.share(config.examples)
        self.pairs = [(backend, check) for backend in backends for check in config.checks]
        self.keys = [BackendResult(b.name, check=c.name).key for b, c in self.pairs]
        self.label = f"[shard {config.shard}] " if config.shard.count > 1 else ""
        self.checkpoint = Checkpoints(state, state_file)
        self.hooks = Hooks(progress=self._report, checkpoint=self.checkpoint, on_case=on_case)
        for backend, check in self.pairs:
            fresh = BackendResult(backend.name, check=check.name, declared=declared(backend.capabilities, config.limits))
            state.results.setdefault(fresh.key, fresh)
        state.save(state_file)

    def _say(self, line: str) -> None:
        if self.progress:
            self.progress(f"{self.label}{line}")

    def _report(self, result: BackendResult) -> None:
        total = sum(len(r.findings) for r in self.state.results.values())
        self._say(f"  {result.line()}; findings so far {total}")

    def _wants_more(self, result: BackendResult, first: bool) -> bool:
        """Whether a pair takes a turn: in the first round, any with work left (one at a finding only with
        ``rerun_findings``); later, only one the deadline stopped."""
        if not first:
            return result.status == "running" and result.examples < self.target
        if result.status == "finding":
            return self.config.rerun_findings
        return result.not_applicable is None and result.status != "exhausted" and result.examples < self.target

    def run(self) -> list[BackendResult]:
        config, results = self.config, self.state.results
        todo = [(pair, key) for pair, key in zip(self.pairs, self.keys) if self._wants_more(results[key], True)]
        start, seed = time.monotonic(), config.seed + config.shard.index
        if self.compile_plan is None and config.compile_budget is not None:
            known = (lambda b: known_findings(config.ledger, b)) if config.ledger else None
            self.compile_plan = CompilePlan.make([b for (b, c), _key in todo if c is ORACLE], config.limits,
                                                 budget=config.compile_budget, seed=seed, known=known)
        end = None if config.time_budget is None else start + config.time_budget
        workers: dict[str, Any] = {}  # one worker pool per device, shared by every pair (started on its first case)
        worker_processes("cpu")  # a bad PA_ORACLE_WORKER_PROCESSES is bad input before anything runs
        drawers = Drawers(draw_processes())  # helper processes drawing ahead, shared likewise
        schedule = Schedule(results, end, self.compile_plan, say=self._say if self.progress else lambda line: None)
        todo = schedule.order(todo)  # those whose variants are building go after the ready ones
        try:
            if self.compile_plan is not None:
                self.compile_plan.start(self.compile_plan.tasks(config.limits, seed, isolatable), self.progress)
            if self.target > CHUNK and config.pipeline and any(
                    isolates(b, config.isolate) and getattr(c, "pipelined", True) for (b, c), _key in todo):
                drawers.start()  # only a pipelined (isolated) pair sends them chunks (not the write check), after its first
            self._rounds(todo, schedule, Shared(cutoff=end, workers=workers, drawers=drawers), end)
            if drawers.taken or drawers.redrawn:
                self._say(f"{drawers.taken} chunks drawn ahead by {drawers.count} draw processes "
                          f"({drawers.redrawn} more drawn again here: a case an earlier chunk drew since)")
        except BaseException:
            try:
                self.checkpoint.flush(broken=True)  # each pair as of its last whole chunk (a Ctrl-C, an error of the tool)
            except Exception:  # noqa: BLE001 - a save that fails (a full disk) must not hide what stopped the run
                pass  # (the file keeps its last save)
            raise
        finally:
            self._close(drawers, workers)
        return [results[key] for key in self.keys]

    def _rounds(self, todo: list[tuple[Any, str]], schedule: Schedule, shared: Shared, end: float | None) -> None:
        """Rounds of turns: a pair runs again only when the deadline (not a finding, an end or a failure) stopped it."""
        results, turns = self.state.results, 0
        pair_config = self.config.replace(examples=self.target)
        while True:
            active = [(pair, key) for pair, key in todo if self._wants_more(results[key], turns == 0)]
            turns += 1
            if not active or (turns > 1 and end is not None and time.monotonic() >= end):
                break
            for turn in schedule.turns(active, first=turns == 1):
                (backend, check), key, plan = turn.pair, turn.key, turn.plan
                self._say(f"{_doing(backend, check)} ..." + (f" (turn {turns})" if turn.again else ""))
                if plan is not None:
                    plan.announce = self.progress
                turn_shared = dataclasses.replace(shared, deadline=turn.deadline, variants=plan)
                fuzz_backend(backend, pair_config, check=check, resume=results[key], shared=turn_shared, hooks=self.hooks)
                if plan is not None:
                    results[key].coverage.variants = plan.lines()
                self.checkpoint.flush()
            self.checkpoint.flush()  # (a pair settled without a turn: not built)
            if end is None:
                break  # without a budget each pair ran to its count, its finding or its end

    def _close(self, drawers: Drawers, workers: dict[str, Any]) -> None:
        drawers.close()
        for worker in workers.values():
            worker.close()
        if self.compile_plan is not None:
            self.compile_plan.close()
            for (backend, check), key in zip(self.pairs, self.keys):
                if (plan := self.compile_plan.plan_for(backend)) is not None and check is ORACLE:
                    self.state.results[key].coverage.variants = plan.lines()


def _doing(backend: Backend, check: CaseCheck) -> str:
    """What a pair's turn does, as its progress line says it: "fuzzing sdpa-math on cpu"."""
    pinned = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f"{backend.device} (CUDA_VISIBLE_DEVICES={pinned})" if backend.device == "cuda" and pinned else backend.device
    what = f"fuzzing {backend.name}" if check is ORACLE else f"checking {backend.name} {check.name}"
    return f"{what} on {where}"


def known_findings(ledger: Sequence[Entry] | None, backend: Backend) -> KnownFindings:
    """Whether a drawn case is a known finding of ``backend`` (the oracle comparison) at its installed versions."""
    return _known_test(ledger, backend, ORACLE, backend.versions())


def _known_test(ledger: Sequence[Entry] | None, backend: Backend, check: CaseCheck, versions: dict[str, str]) -> KnownFindings:
    """Whether a drawn case is a known finding of ``backend`` at ``versions`` (a ledger class), for ``check``."""
    return KnownFindings(tuple(ledger or ()), backend.name, tuple(sorted(versions.items())), backend.kernel_family, check.name)


def judge_one(backend: Backend, check: CaseCheck, case: Case, config: CampaignConfig = CampaignConfig()) -> BackendResult:
    """Run ``check`` on one given case (``metamorphic --case``), isolated as a campaign runs it (a
    crash replays as a crash), and save a finding as a campaign does."""
    from pa_oracle.fuzz.run.judge import case_judge

    result = BackendResult(backend.name, check=check.name, status="done")
    capabilities = check.capabilities(backend)
    if isinstance(capabilities, str):
        result.not_applicable = capabilities
        return result
    kernel_spec = _kernel_spec(backend)
    start = time.monotonic()
    with case_judge(backend, isolate=config.isolate, timeout=config.case_timeout, tolerance=config.tolerance,
                    judge=check) as judge:
        outcome = judge(case)
    result.seconds = time.monotonic() - start
    if outcome.status == "error":
        result.status = "incomplete"
        saved = _saved_at(outcome, backend, config.out_dir, kernel_spec)
        result.notes.append(f"the oracle could not judge case {case.case_id}{saved}: {outcome.message}")
        return result
    count(result, outcome)
    if outcome.is_finding:
        result.status = "finding"
        _record_finding(result, outcome, backend, config.out_dir, kernel_spec)
    return result
