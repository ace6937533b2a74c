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

import math
import os
import time
from pathlib import Path
from typing import Any, Callable

from hypothesis import reject
from hypothesis.errors import Flaky, Unsatisfiable
from pa_oracle.backends.base import Backend
from pa_oracle.backends.user import REFUSES_VIEWS, UserKernel
from pa_oracle.fuzz.campaign.coverage import declared
from pa_oracle.fuzz.campaign.ledger import Entry
from pa_oracle.fuzz.campaign.findings import publish_finding, save_finding, save_unjudged
from pa_oracle.fuzz.campaign.drawers import SENT_IDS, Drawers, DrawSpec, KnownFindings, campaign_settings, draw_processes, run_chunk
from pa_oracle.fuzz.campaign.overlap import DrawnChunk, Prefetch, draw_chunk, queue_drawn
from pa_oracle.fuzz.campaign.requests import fewer_requests
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.fuzz.campaign.state import BackendResult, CampaignState, Checkpoints, FindingRecord
from pa_oracle.fuzz.campaign.compile_plan import CompilePlan
from pa_oracle.fuzz.campaign.schedule import Schedule
from pa_oracle.fuzz.campaign.variants import VariantPlan
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.run.isolation import CASE_TIMEOUT, OUT_OF_TIME, OutOfTime, isolatable, isolated_by_default
from pa_oracle.fuzz.run.pool import WorkerPool, worker_processes
from pa_oracle.fuzz.run.runner import ORACLE, Check, OracleDisagreement, Outcome
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.report import limit_ratio
from pa_oracle.oracle.tolerance import Tolerance
from pa_oracle.oracle.visibility import attended

CHUNK = 25  # examples per Hypothesis run; the time budget is checked and the state saved between runs

__all__ = ["CHUNK", "BackendResult", "campaign_settings", "fuzz_backend", "run_campaign", "save_finding"]


class _Finding(Exception):
    pass


_TURN_OVER = "the deadline came before the next case"


class _Stop(BaseException):
    """Ends a Hypothesis run at once, without shrinking (Hypothesis passes BaseExceptions other than
    SystemExit and GeneratorExit through): out of time, a hang (each shrink step would cost a whole
    timeout) or an outcome the oracle could not judge."""


def fuzz_backend(
    backend: Backend,
    *,
    check: Check = ORACLE,
    examples: int = 200,
    base_seed: int = 0,
    deadline: float | None = None,
    cutoff: float | None = None,
    limits: Limits = Limits(),
    tolerance: Tolerance = Tolerance(),
    out_dir: Path | None = None,
    kernel_spec: str | None = None,
    progress: Callable[[BackendResult], None] | None = None,
    isolate: bool | None = None,
    case_timeout: float = CASE_TIMEOUT,
    isolate_timeout: float | None = None,
    shard: Shard = Shard(),
    ledger: list[Entry] | None = None,
    resume: BackendResult | None = None,
    checkpoint: Callable[[BackendResult], None] | None = None,
    workers: dict[str, Any] | None = None,
    on_case: Callable[[BackendResult, bool], None] | None = None,  # after each judged case (False: shrinking)
    variants: VariantPlan | None = None,
    pipeline: bool = True,
    drawers: Drawers | None = None,
) -> BackendResult:
    """Run ``check`` (default: the comparison with the oracle) on one backend until it ran
    ``examples`` cases (counting those of ``resume``), the monotonic ``deadline`` passed (no case
    starts after it; an isolated case still running at ``cutoff``, default ``deadline``, is cut
    off as out of time), or a finding. A check that cannot apply to the backend runs nothing (``result.not_applicable``).

    ``resume`` continues an earlier result at its next chunk; ``checkpoint`` is called with the
    result after every chunk. With ``ledger``, drawn cases that an entry covers are skipped. With
    ``isolate`` (default: ``pa_oracle.fuzz.run.isolation.isolated_by_default``) every case runs in a worker
    process: a crash of the process or a case running longer than ``case_timeout`` seconds is a
    finding, and the worker restarts; a case still running at ``deadline`` (but within its
    timeout) is out of time, not a finding. ``isolate_timeout`` is the older spelling of
    ``isolate=True, case_timeout=...``. ``workers`` (device -> ``Worker``) shares one worker
    process per device with the caller's other backends and checks (the caller closes them);
    without it the backend's own worker is closed at the end. ``drawers`` draws the chunks after the
    next one in helper processes while the worker judges (``pa_oracle.fuzz.campaign.drawers``: the same
    cases as without). ``result.start_seconds`` and
    ``result.compile_seconds`` say how much of ``result.seconds`` went to starting workers
    (process, CUDA context, imports) and to compiling (the first case of each variant not built).

    The result's status is "done", "finding", "running" (the deadline came first), "exhausted"
    (the strategy drew nothing new) or "incomplete" with the reason in ``notes``: no example
    judged, a flaky failure that left no finding, a worker that did not start, or an internal
    error. ``result.is_complete`` says whether the run can be trusted as it is.
    """
    from pa_oracle.fuzz.run.isolation import (
        IsolatedBackend,
        OutOfTime,
        WorkerStartError,
        check_timeout,
        isolatable,
    )

    if isolate_timeout is not None:
        isolate, case_timeout = True, isolate_timeout
    check_timeout(case_timeout)
    result = resume if resume is not None else BackendResult(backend.name, check=check.name)
    result.finding = result.finding_dir = result.repro = None  # this run's finding only
    capabilities = check.capabilities(backend)
    if isinstance(capabilities, str):
        result.not_applicable, result.status = capabilities, "done"
        if checkpoint:
            checkpoint(result)
        return result
    result.declared = declared(capabilities, limits)
    seen = set(result.seen)
    versions = backend.versions() if ledger else {}
    isolated = None
    if isolated_by_default(backend) if isolate is None else isolate:
        spec = isolatable(backend)  # what a worker can load it from (kernel_spec is for repro commands)
        if spec is None:
            result.notes.append(f"{backend.name} is not importable by its name: its cases ran in this process")
        else:
            shared = None
            if workers is not None:  # one worker per device, shared by every backend and check of the campaign
                device = backend.device or "cpu"
                shared = workers.get(device) or workers.setdefault(
                    device, WorkerPool(worker_processes(device), timeout=case_timeout, tolerance=tolerance))
            isolated = IsolatedBackend(backend, spec, timeout=case_timeout, tolerance=tolerance, worker=shared)
    strategy = variants.strategy(limits) if variants is not None else cases(capabilities, limits)
    failing: list[Outcome] = []
    stopped: list[str] = []  # why a Hypothesis run was ended by _Stop
    internal: list[Exception] = []  # errors of the tool itself while judging a case

    prefetch = Prefetch(isolated, check) if pipeline and isolated is not None else None
    changed_before = isolated.worker.rejudged_changed if isolated is not None else 0

    def judge_timed(case: Case) -> tuple[Outcome, float | None]:
        """(outcome, seconds the worker spent on it if it was judged ahead in the pipeline, else None)."""
        if prefetch is not None:
            got = prefetch.outcome(case, cutoff or deadline)
            if got is not None:
                return got
            if (cutoff or deadline) is not None and time.monotonic() > (cutoff or deadline):  # type: ignore[operator]
                raise OutOfTime(f"{OUT_OF_TIME} before case {case.case_id}")  # (its queued outcome was dropped)
        if isolated is not None:
            return isolated.check(case, cutoff or deadline, check), None
        return check.judge(case, backend, tolerance), None

    def judge(case: Case) -> Outcome:
        return judge_timed(case)[0]

    def start_clock() -> float:
        """Seconds this backend's worker spent starting and loading so far (0 in-process)."""
        return isolated.start_seconds if isolated is not None else 0.0

    is_known = _known_test(ledger, backend, check, versions)

    def prop(case: Case) -> None:
        searching = not failing  # False while Hypothesis shrinks a failure: nothing is counted then
        case = case.replace(seed=shard.case_seed(case.seed))
        judged_ahead = prefetch is not None and searching and (case.case_id in prefetch.done or case.case_id in prefetch.queue)
        out_of_time = deadline is not None and time.monotonic() > deadline and not judged_ahead
        if out_of_time and not searching:
            stopped.append("out of time while shrinking")
            raise _Stop  # the finding so far is kept: a budget bounds shrinking too
        if out_of_time:
            stopped.append(_TURN_OVER)
            raise _Stop  # at once: rejecting the rest of the chunk would still draw each of them (seconds of draws)
        if searching:
            if case.case_id in seen:
                reject()  # drawn before in this campaign (Hypothesis starts every run at the simplest case)
            seen.add(case.case_id)
            result.seen.append(case.case_id)
        if is_known(case):
            if searching:
                result.skipped_known += 1
            reject()  # also while shrinking, so that a new failure does not shrink into a known one
        starting = start_clock()
        if variants is not None and searching and not judged_ahead:
            variants.before(case)
        try:
            judging = time.monotonic()
            outcome, ahead_seconds = judge_timed(case)
            started = start_clock() - starting
            result.start_seconds += started
            if variants is not None and searching:
                took = ahead_seconds if ahead_seconds is not None else time.monotonic() - judging - started
                result.compile_seconds += variants.observe(case, took)
        except (OutOfTime, WorkerStartError) as exc:
            result.start_seconds += start_clock() - starting
            stopped.append(str(exc))
            if searching:
                result.seen.pop()  # not judged: a resume draws it again
            raise _Stop from None
        except Exception as exc:  # noqa: BLE001 - the tool failed (not the kernel): Hypothesis must not shrink it
            internal.append(exc)
            stopped.append(f"internal error: {type(exc).__name__}: {exc}")
            raise _Stop from None
        if outcome.status == "error":
            if not searching:
                reject()  # a shrink candidate the oracle cannot judge is no smaller failure
            stopped.append(f"the oracle could not judge case {case.case_id} ({case.summary()}){_saved_at(outcome, backend, out_dir, kernel_spec)}: "
                           f"{outcome.message}")
            raise _Stop
        if searching:
            _count(result, outcome)
        if on_case:
            on_case(result, searching)
        if outcome.is_finding:
            failing.append(outcome)
            if outcome.message.startswith("hang:"):
                raise _Stop  # shrinking a hang costs a whole timeout per step
            raise _Finding(outcome.message)

    def chunk_run(index: int, n: int) -> Callable[[Callable[[Case], None]], None]:
        """Chunk ``index``'s Hypothesis run (``n`` examples), given its test function."""
        def run(fn: Callable[[Case], None]) -> None:
            run_chunk(strategy, shard, base_seed, index, n, fn)

        return run

    def draw_spec() -> DrawSpec:
        """How a helper process draws this backend's chunks now (the plan's allowed keys as they are)."""
        steering = variants.steering() if variants is not None else None
        return DrawSpec(backend.capabilities if variants is not None else capabilities, limits, steering, is_known, shard,
                        base_seed)

    def draw_ahead(index: int, n: int, also_seen: set[str], after: int) -> DrawnChunk:
        """Draw chunk ``index`` (a helper's draw if one drew it and it is the engine's, else here) and queue
        its cases in the worker (``pa_oracle.fuzz.campaign.overlap``); then send the next chunks to the
        helpers (``after``: the examples left after this chunk)."""
        assert prefetch is not None
        starting = start_clock()
        announce = variants.before if variants is not None else None
        helpers = drawers if drawers is not None and drawers.active else None
        spec = draw_spec() if helpers is not None else None
        helped = None
        if helpers is not None and spec is not None:
            helped = helpers.take(spec, index, n, lambda case_id: case_id in seen or case_id in also_seen)
        if helped is not None:
            chunk = queue_drawn(index, helped.events, prefetch=prefetch, deadline=deadline, cutoff=cutoff or deadline,
                                announce=announce)
        else:
            chunk = draw_chunk(
                index, lambda fn: chunk_run(index, n)(lambda c: fn(c.replace(seed=shard.case_seed(c.seed)))),
                seen=seen | also_seen, known=is_known, prefetch=prefetch, deadline=deadline, cutoff=cutoff or deadline,
                announce=announce,
            )
        if helpers is not None and spec is not None and chunk.complete:
            drawn = set(result.seen[-SENT_IDS:]) | also_seen | chunk.ids
            for j in range(1, helpers.count + 1):
                if (size := min(CHUNK, after - CHUNK * (j - 1))) > 0:
                    helpers.send(spec, index + j, size, drawn)
        result.start_seconds += start_clock() - starting
        return chunk

    ahead: DrawnChunk | None = None  # the next chunk, drawn (and queued) while the worker judged this one
    try:
        # (a chunk drawn ahead is judged even past the deadline: it was drawn only when expected to finish by it)
        while result.examples < examples and (deadline is None or time.monotonic() < deadline or ahead is not None):
            n = min(CHUNK, examples - result.examples)
            before, chunk_start = result.examples, time.monotonic()
            broke: str | None = None
            if prefetch is not None:
                index, rest = result.chunks_done, examples - result.examples - n
                chunk = ahead if ahead is not None and ahead.index == index else draw_ahead(index, n, set(), rest)
                ahead = None
                if chunk.complete and rest > 0 and prefetch.will_finish_by(min(CHUNK, rest), deadline):
                    # while the worker judges `chunk`
                    ahead = draw_ahead(index + 1, min(CHUNK, rest), chunk.ids, rest - min(CHUNK, rest))
                # every case passed (or was unsupported): counted as drawn; else the engine's own run
                # judges the chunk (shrinking included), taking the outcomes judged so far
                counted, broke = _count_clean_chunk(result, chunk, prefetch, seen, variants, on_case, cutoff or deadline) \
                    if chunk.complete else (False, None)
                if chunk.error is not None and not chunk.queued:
                    counted, broke = True, chunk.error  # the worker did not start (or the budget ran out first), as in prop
                run_it = not counted
            else:
                run_it = True
            try:
                if run_it:
                    chunk_run(result.chunks_done, n)(prop)
            except Unsatisfiable:
                pass  # every example of the chunk was rejected (out of time, or all drawn before)
            except _Finding:
                pass
            except _Stop:
                if internal and isinstance(internal[-1], OracleDisagreement):
                    raise internal[-1] from None  # a bug of the oracle itself: the run fails (exit 3)
                broke = stopped[-1] if stopped and not failing else None
                if broke == _TURN_OVER:
                    broke = None  # the deadline came between two cases: nothing was cut
            except Flaky as exc:
                result.notes.append("the failure did not reproduce on replay (flaky kernel): " + str(exc)[:200])
                broke = None if failing else "Hypothesis reported a flaky test without a finding"
            except Exception as exc:  # noqa: BLE001 - an internal error: the backend stops, the campaign goes on
                broke = f"internal error: {type(exc).__name__}: {exc}"
            result.chunks_done += 1
            result.seconds += time.monotonic() - chunk_start
            # cases judged side by side can each count one compile: the split never gives judging less than nothing
            result.compile_seconds = min(result.compile_seconds, max(result.seconds - result.start_seconds, 0.0))
            out_of_time = deadline is not None and time.monotonic() > deadline
            if broke is not None:
                result.notes.append(broke)
            if failing:
                result.status = "finding"
                first = failing[0]  # the first failing case of the search, kept beside the minimal one
                failing[-1] = fewer_requests(failing[-1], judge, is_known)
                result.coverage.add(failing[-1].case)  # the minimal case was judged too (while shrinking): its features ran
                _record_finding(result, failing[-1], backend, out_dir, kernel_spec, first=first)
            elif broke is not None and not broke.startswith(OUT_OF_TIME):
                result.status = "incomplete"
            elif result.examples == before and not out_of_time and broke is None:
                result.status = "exhausted"  # the strategy drew nothing new: not complete either
                result.notes.append(f"the strategy drew no new case in chunk {result.chunks_done}")
            else:
                result.status = "done" if result.examples >= examples else "running"
            if checkpoint:
                checkpoint(result)
            if progress:
                progress(result)
            if result.status in ("finding", "incomplete", "exhausted"):
                break
        if _judged_nothing(result) and checkpoint:
            checkpoint(result)
    except BaseException:
        if prefetch is not None:
            prefetch.abandon()  # e.g. a Ctrl-C in the middle of an exchange with the worker
        raise
    finally:
        if prefetch is not None:  # cases judged ahead and not counted: the worker must be idle for the next backend
            prefetch.discard(cutoff or deadline)
        if drawers is not None:
            drawers.forget()  # chunks drawn ahead and not taken: the next backend's turn must not wait behind them
        if isolated is not None and (changed := isolated.worker.rejudged_changed - changed_before):
            result.notes.append(f"{changed} case(s) judged beside another gave a verdict other than a pass and another verdict "
                                "judged again alone (the second is kept): a kernel whose result depends on what runs beside it, or flaky")
        if isolated is not None and workers is None:
            isolated.close()
    return result


def _count_clean_chunk(
    result: BackendResult, chunk: DrawnChunk, prefetch: Prefetch, seen: set[str], variants: VariantPlan | None,
    on_case: Callable[[BackendResult, bool], None] | None, deadline: float | None,
) -> tuple[bool, str | None]:
    """Count a drawn chunk as the engine's run would have, if every queued case passed or was
    unsupported: (True, None); (True, why) when the budget's end cut it off (the cases judged before
    are counted, as the engine's run counts them); (False, None) otherwise: nothing is counted and
    the outcomes stay in ``prefetch`` for the engine's own run."""
    cut = None
    try:
        for case in chunk.queued:  # in order; the first case that is not clean ends the wait
            prefetch.collect_through([case.case_id], deadline)
            got = prefetch.done.get(case.case_id)
            if not isinstance(got, tuple) or got[0].status not in ("pass", "unsupported"):
                return False, None  # a finding, an error, a dropped case: the engine's own run judges the chunk
    except OutOfTime as exc:
        cut = str(exc)
    events = chunk.events
    if cut is not None:  # the judged prefix: up to the first queued case without an outcome
        missing = next((i for i, (kind, case) in enumerate(events) if kind == "queued" and case.case_id not in prefetch.done), len(events))
        events = events[:missing]
    for kind, case in events:  # (every queued case of ``events`` was found clean above)
        seen.add(case.case_id)
        result.seen.append(case.case_id)
        if kind == "known":
            result.skipped_known += 1
            continue
        outcome, seconds = prefetch.done.pop(case.case_id)  # type: ignore[misc]
        if variants is not None:
            result.compile_seconds += variants.observe(case, seconds)
        _count(result, outcome)
        if on_case:
            on_case(result, True)
    return True, cut


def _judged_nothing(result: BackendResult) -> bool:
    """Mark a backend that judged nothing incomplete, never ok; True if it did. At a turn's end: none
    ran, or each was unsupported. At its end (its count reached): any reason ``BackendResult.judged_nothing``
    gives (every judged case attended no key, nearly every case unsupported): a share is judged on the
    whole run, not on a first turn's few cases."""
    if result.status in ("finding", "incomplete", "exhausted") or result.findings:
        return False
    why = result.judged_nothing()
    if why is None or (result.status != "done" and result.examples > result.unsupported):
        return False
    result.status = "incomplete"
    if why not in result.notes:
        result.notes.append(why)
    return True


def _count(result: BackendResult, outcome: Outcome) -> None:
    result.examples += 1
    result.passed += outcome.status == "pass"
    result.unsupported += outcome.status == "unsupported"
    result.exact += outcome.status == "pass" and bool(outcome.exact)
    if outcome.status == "unsupported":
        reason = outcome.message.splitlines()[0] if outcome.message else ""
        if outcome.check == ORACLE.name:  # one kind counted by name (an oracle case's reasons are many and long)
            reason = REFUSES_VIEWS if reason.removeprefix("Unsupported: ").startswith(REFUSES_VIEWS) else ""
        if reason:
            result.skip_reasons[reason] = result.skip_reasons.get(reason, 0) + 1
    if outcome.status != "unsupported":
        result.coverage.add(outcome.case)
        result.no_keys += not attends_a_key(outcome.case)
    if outcome.status == "pass" and outcome.verdict is not None and outcome.verdict.out is not None:
        if math.isfinite(ratio := outcome.verdict.out.ratio):  # inf: the control was exact, the kernel within the floor
            result.worst_ratio = max(result.worst_ratio, ratio)
        if math.isfinite(allowed := limit_ratio(outcome.verdict.out)):
            result.worst_allowed = max(result.worst_allowed, allowed)


def attends_a_key(case: Case) -> bool:
    """Whether some query row of ``case`` attends some key (``pa_oracle.oracle.case``): a case where none
    does has output 0 and LSE -inf everywhere, and a kernel that declines every other case passes only such.
    Without a custom mask a request with a query and a key has one (its last query sees its last key: the
    causal and window tests both allow the key at the query's own position)."""
    if case.custom_mask is None:
        return any(qo > 0 and kv > 0 for qo, kv in zip(case.layout.qo_lens, case.layout.kv_lens))
    return any(bool(rows.any()) for rows in attended(case))


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
    if out_dir is not None:
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
    *,
    examples: int,
    time_budget: float | None = None,
    limits: Limits = Limits(),
    shard: Shard = Shard(),
    ledger: list[Entry] | None = None,
    rerun_findings: bool = False,
    isolate: bool | None = None,
    case_timeout: float = CASE_TIMEOUT,
    out_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
    checks: tuple[Check, ...] = (ORACLE,),
    tolerance: Tolerance = Tolerance(),
    on_case: Callable[[BackendResult, bool], None] | None = None,
    compile_budget: float | None = None,
    compile_plan: CompilePlan | None = None,
) -> list[BackendResult]:
    """Run every check of ``checks`` on ``backends``, one (backend, check) after another, on
    ``shard``, continuing ``state`` and saving it to ``state_file`` (``Checkpoints``). ``examples``
    is the campaign's total per backend and check (this shard runs its share); the time budget is
    shared by the pairs that still have work (each turn gets an equal share of what is left, so
    time one pair did not use goes to the others; a pair the deadline stopped gets another turn
    while time is left) and bounds a hanging case too. A pair whose variants are still building
    (``compile_plan``) gives its place to the next and waits only when no other pair is left; that wait
    counts as its compile time. One worker process per device serves
    every isolated pair. A pair that stopped
    at a finding runs again only with ``rerun_findings``. ``isolate`` None:
    ``pa_oracle.fuzz.run.isolation.isolated_by_default`` per backend. ValueError for a
    ``case_timeout`` that is not a finite number > 0. ``compile_plan`` (``pa_oracle.fuzz.campaign.compile_plan``,
    made from ``compile_budget`` seconds when not given): each backend draws inside its built variants, the
    planned ones built together in the background while ready pairs judge; None (no budget) draws without
    that restriction."""
    from pa_oracle.fuzz.run.isolation import check_timeout

    check_timeout(case_timeout)
    target = shard.share(examples)
    pairs = [(backend, check) for backend in backends for check in checks]
    for backend, check in pairs:
        fresh = BackendResult(backend.name, check=check.name, declared=declared(backend.capabilities, limits))
        state.results.setdefault(fresh.key, fresh)
    state.save(state_file)

    def wants_more(result: BackendResult) -> bool:
        if result.status == "finding":
            return rerun_findings
        return result.not_applicable is None and result.status != "exhausted" and result.examples < target

    keys = [BackendResult(b.name, check=c.name).key for b, c in pairs]
    todo = [(pair, key) for pair, key in zip(pairs, keys) if wants_more(state.results[key])]
    start = time.monotonic()
    seed = int(state.config.get("seed", 0)) + shard.index
    if compile_plan is None and compile_budget is not None:
        known = (lambda b: known_findings(ledger, b)) if ledger else None
        compile_plan = CompilePlan.make([b for (b, c), _key in todo if c is ORACLE], limits, budget=compile_budget, seed=seed,
                                        known=known)
    end = None if time_budget is None else start + time_budget
    label = f"[shard {shard}] " if shard.count > 1 else ""

    checkpoint = Checkpoints(state, state_file)

    def report(result: BackendResult) -> None:
        if progress:
            total = sum(len(r.findings) for r in state.results.values())
            progress(f"  {label}{result.line()}; findings so far {total}")

    workers: dict[str, Any] = {}  # one worker pool per device, shared by every backend and check (started on its first case)
    worker_processes("cpu")  # a bad PA_ORACLE_WORKER_PROCESSES is bad input before anything runs
    drawers = Drawers(draw_processes())  # helper processes drawing ahead, shared likewise
    schedule = Schedule(state.results, end, compile_plan, say=lambda line: progress(f"{label}{line}") if progress else None)
    todo = schedule.order(todo)  # those whose variants are building go after the ready ones
    try:
        if compile_plan is not None:
            compile_plan.start(compile_plan.tasks(limits, seed, isolatable), progress)
        if target > CHUNK and any(isolated_by_default(b) if isolate is None else isolate for (b, _c), _key in todo):
            drawers.start()  # only a pipelined (isolated) backend sends them chunks, and only those after its first
        turns = 0
        while True:  # turns: a pair runs again only when the deadline (not a finding, an end or a failure) stopped it
            active = [(pair, key) for pair, key in todo if (wants_more(state.results[key]) if turns == 0 else
                      state.results[key].status == "running" and state.results[key].examples < target)]
            turns += 1
            if not active or (turns > 1 and end is not None and time.monotonic() >= end):
                break
            for turn in schedule.turns(active, first=turns == 1):
                (backend, check), key, plan = turn.pair, turn.key, turn.plan
                if progress:
                    progress(f"{label}{_doing(backend, check)} ..." + (f" (turn {turns})" if turn.again else ""))
                if plan is not None:
                    plan.announce = progress
                fuzz_backend(
                    backend, check=check, examples=target, base_seed=int(state.config.get("seed", 0)), deadline=turn.deadline,
                    cutoff=end, limits=limits, tolerance=tolerance, out_dir=out_dir,
                    kernel_spec=backend.name if isinstance(backend, UserKernel) else None,
                    progress=report, isolate=isolate, case_timeout=case_timeout, shard=shard, ledger=ledger,
                    resume=state.results[key], checkpoint=checkpoint, workers=workers, on_case=on_case, variants=plan,
                    drawers=drawers,
                )
                if plan is not None:
                    state.results[key].coverage.variants = plan.lines()
                checkpoint.flush()
            checkpoint.flush()  # (a pair settled without a turn: not built)
            if end is None:
                break  # without a budget each pair ran to its count, its finding or its end
        if progress and (drawers.taken or drawers.redrawn):
            progress(f"{label}{drawers.taken} chunks drawn ahead by {drawers.count} draw processes "
                     f"({drawers.redrawn} more drawn again here: a case an earlier chunk drew since)")
    except BaseException:
        try:
            checkpoint.flush(broken=True)  # each pair as of its last whole chunk (a Ctrl-C, an error of the tool)
        except Exception:  # noqa: BLE001 - a save that fails (a full disk) must not hide what stopped the run
            pass  # (the file keeps its last save)
        raise
    finally:
        drawers.close()
        for worker in workers.values():
            worker.close()
        if compile_plan is not None:
            compile_plan.close()
            for (backend, check), key in zip(pairs, keys):
                if (plan := compile_plan.plan_for(backend)) is not None and check is ORACLE:
                    state.results[key].coverage.variants = plan.lines()
    return [state.results[key] for key in keys]


def _doing(backend: Backend, check: Check) -> str:
    """What a pair's turn does, as its progress line says it: "fuzzing sdpa-math on cpu"."""
    pinned = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f"{backend.device} (CUDA_VISIBLE_DEVICES={pinned})" if backend.device == "cuda" and pinned else backend.device
    what = f"fuzzing {backend.name}" if check is ORACLE else f"checking {backend.name} {check.name}"
    return f"{what} on {where}"


def known_findings(ledger: list[Entry] | None, backend: Backend) -> KnownFindings:
    """Whether a drawn case is a known finding of ``backend`` (the oracle comparison) at its installed versions."""
    return _known_test(ledger, backend, ORACLE, backend.versions())


def _known_test(ledger: list[Entry] | None, backend: Backend, check: Check, versions: dict[str, str]) -> KnownFindings:
    """Whether a drawn case is a known finding of ``backend`` at ``versions`` (a ledger class), for ``check``."""
    return KnownFindings(tuple(ledger or ()), backend.name, tuple(sorted(versions.items())), backend.kernel_family, check.name)


def judge_one(
    backend: Backend,
    check: Check,
    case: Case,
    *,
    tolerance: Tolerance = Tolerance(),
    out_dir: Path | None = None,
    kernel_spec: str | None = None,
    isolate: bool | None = None,
    case_timeout: float = CASE_TIMEOUT,
) -> BackendResult:
    """Run ``check`` on one given case (``metamorphic --case``), isolated as a campaign runs it (a
    crash replays as a crash), and save a finding as a campaign does."""
    from pa_oracle.fuzz.run.isolation import case_judge, check_timeout

    result = BackendResult(backend.name, check=check.name, status="done")
    capabilities = check.capabilities(backend)
    if isinstance(capabilities, str):
        result.not_applicable = capabilities
        return result
    start = time.monotonic()
    with case_judge(backend, isolate=isolate, timeout=check_timeout(case_timeout), tolerance=tolerance, judge=check) as judge:
        outcome = judge(case)
    result.seconds = time.monotonic() - start
    if outcome.status == "error":
        result.status = "incomplete"
        result.notes.append(f"the oracle could not judge case {case.case_id}{_saved_at(outcome, backend, out_dir, kernel_spec)}: {outcome.message}")
        return result
    _count(result, outcome)
    if outcome.is_finding:
        result.status = "finding"
        _record_finding(result, outcome, backend, out_dir, kernel_spec)
    return result
