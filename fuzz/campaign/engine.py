"""A fuzz campaign: Hypothesis draws cases a backend supports, ``check_case`` judges them, and the
first finding per backend is shrunk to a minimal case and saved (case.json + tensors.npz +
report.md, written in a temp folder that is then renamed) with a repro command.

Verification model: examples run in chunks of ``CHUNK``, each chunk one Hypothesis run with its
own seed (``pa_oracle.fuzz.campaign.shard``). A case drawn before in the campaign (same case id) is rejected, so no
example runs twice; a case that a ledger entry's ``matches`` predicate covers is skipped as known,
so the campaign surfaces new findings. After every chunk the state (``pa_oracle.fuzz.campaign.state``) is saved:
``run_campaign`` on that state continues at the next chunk after a kill.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import time
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, given, reject, seed, settings
from hypothesis.errors import Flaky, Unsatisfiable
from pa_oracle.backends.base import Backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.coverage import declared
from pa_oracle.fuzz.campaign.ledger import Entry, known_finding
from pa_oracle.fuzz.campaign.outdir import FindingNotSaved, holds_case, publish_folder, rescue
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.fuzz.campaign.state import BackendResult, CampaignState, FindingRecord
from pa_oracle.fuzz.campaign.variants import VariantPlan, plan_variants
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.run.isolation import CASE_TIMEOUT, OUT_OF_TIME
from pa_oracle.fuzz.run.runner import OracleDisagreement, Outcome, check_case
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.report import format_report, repro_command
from pa_oracle.oracle.tensors import make_tensors, save_tensors
from pa_oracle.oracle.tolerance import Tolerance, Verdict

CHUNK = 25  # examples per Hypothesis run; the time budget is checked and the state saved between runs

__all__ = ["CHUNK", "BackendResult", "fuzz_backend", "run_campaign", "save_finding"]


class _Finding(Exception):
    pass


class _Stop(BaseException):
    """Ends a Hypothesis run at once, without shrinking (Hypothesis passes BaseExceptions other than
    SystemExit and GeneratorExit through): out of time, a hang (each shrink step would cost a whole
    timeout) or an outcome the oracle could not judge."""


def fuzz_backend(
    backend: Backend,
    *,
    examples: int = 200,
    base_seed: int = 0,
    deadline: float | None = None,
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
    variants: VariantPlan | None = None,
) -> BackendResult:
    """Fuzz one backend until it ran ``examples`` cases (counting those of ``resume``), the monotonic
    ``deadline`` passed, or a finding.

    ``resume`` continues an earlier result at its next chunk; ``checkpoint`` is called with the
    result after every chunk. With ``ledger``, drawn cases that an entry covers are skipped. With
    ``isolate`` (default: ``pa_oracle.fuzz.run.isolation.isolated_by_default``) every case runs in a worker
    process: a crash of the process or a case running longer than ``case_timeout`` seconds is a
    finding, and the worker restarts; a case still running at ``deadline`` (but within its
    timeout) is out of time, not a finding. ``isolate_timeout`` is the older spelling of
    ``isolate=True, case_timeout=...``.

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
        isolated_by_default,
    )

    if isolate_timeout is not None:
        isolate, case_timeout = True, isolate_timeout
    check_timeout(case_timeout)
    result = resume if resume is not None else BackendResult(backend.name)
    result.declared = declared(backend.capabilities, limits)
    result.finding = result.finding_dir = result.repro = None  # this run's finding only
    seen = set(result.seen)
    versions = backend.versions() if ledger else {}
    isolated = None
    if isolated_by_default(backend) if isolate is None else isolate:
        spec = isolatable(backend)  # what a worker can load it from (kernel_spec is for repro commands)
        if spec is None:
            result.notes.append(f"{backend.name} is not importable by its name: its cases ran in this process")
        else:
            isolated = IsolatedBackend(backend, spec, timeout=case_timeout, tolerance=tolerance)
    strategy = variants.strategy(limits) if variants is not None else cases(backend.capabilities, limits)
    failing: list[Outcome] = []
    stopped: list[str] = []  # why a Hypothesis run was ended by _Stop
    internal: list[Exception] = []  # errors of the tool itself while judging a case

    def prop(case: Case) -> None:
        searching = not failing  # False while Hypothesis shrinks a failure: nothing is counted then
        out_of_time = deadline is not None and time.monotonic() > deadline
        if out_of_time and not searching:
            stopped.append("out of time while shrinking")
            raise _Stop  # the finding so far is kept: a budget bounds shrinking too
        if out_of_time:
            reject()  # out of time: Hypothesis has no graceful stop, so the rest are discarded
        case = case.replace(seed=shard.case_seed(case.seed))
        if searching:
            if case.case_id in seen:
                reject()  # drawn before in this campaign (Hypothesis starts every run at the simplest case)
            seen.add(case.case_id)
            result.seen.append(case.case_id)
        if ledger and known_finding(ledger, case, backend.name, versions):
            if searching:
                result.skipped_known += 1
            reject()  # also while shrinking, so that a new failure does not shrink into a known one
        try:
            judging = time.monotonic()
            outcome = isolated.check(case, deadline) if isolated is not None else check_case(backend, case, tolerance)
            if variants is not None and searching:
                variants.observe(case, time.monotonic() - judging)
        except (OutOfTime, WorkerStartError) as exc:
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
            stopped.append(f"the oracle could not judge case {case.case_id} ({case.summary()}): {outcome.message}")
            raise _Stop
        if searching:
            _count(result, outcome)
        if outcome.is_finding:
            failing.append(outcome)
            if outcome.message.startswith("hang:"):
                raise _Stop  # shrinking a hang costs a whole timeout per step
            raise _Finding(outcome.message)

    try:
        while result.examples < examples and (deadline is None or time.monotonic() < deadline):
            n = min(CHUNK, examples - result.examples)
            test = settings(
                max_examples=n, deadline=None, database=None, print_blob=False, report_multiple_bugs=False,
                phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck),
            )(seed(shard.chunk_seed(base_seed, result.chunks_done))(given(strategy)(prop)))
            before, chunk_start = result.examples, time.monotonic()
            broke: str | None = None
            try:
                test()
            except Unsatisfiable:
                pass  # every example of the chunk was rejected (out of time, or all drawn before)
            except _Finding:
                pass
            except _Stop:
                if internal and isinstance(internal[-1], OracleDisagreement):
                    raise internal[-1] from None  # a bug of the oracle itself: the run fails (exit 3)
                broke = stopped[-1] if stopped and not failing else None
            except Flaky as exc:
                result.notes.append("the failure did not reproduce on replay (flaky kernel): " + str(exc)[:200])
                broke = None if failing else "Hypothesis reported a flaky test without a finding"
            except Exception as exc:  # noqa: BLE001 - an internal error: the backend stops, the campaign goes on
                broke = f"internal error: {type(exc).__name__}: {exc}"
            result.chunks_done += 1
            result.seconds += time.monotonic() - chunk_start
            out_of_time = deadline is not None and time.monotonic() > deadline
            if broke is not None:
                result.notes.append(broke)
            if failing:
                result.status = "finding"
                _record_finding(result, failing[-1], backend, out_dir, kernel_spec)
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
    finally:
        if isolated is not None:
            isolated.close()
    return result


def _judged_nothing(result: BackendResult) -> bool:
    """Mark a backend that judged no example (none ran, or each was unsupported) incomplete, never
    ok; True if it did."""
    if result.status in ("finding", "incomplete", "exhausted") or result.findings:
        return False
    if result.examples and result.examples > result.unsupported:
        return False
    why = "no example ran" if result.examples == 0 else f"all {result.examples} examples were unsupported"
    result.status = "incomplete"
    if why not in result.notes:
        result.notes.append(why)
    return True


def _count(result: BackendResult, outcome: Outcome) -> None:
    result.examples += 1
    result.passed += outcome.status == "pass"
    result.unsupported += outcome.status == "unsupported"
    if outcome.status != "unsupported":
        result.coverage.add(outcome.case)
    if outcome.status == "pass" and outcome.verdict is not None and outcome.verdict.out is not None:
        result.worst_ratio = max(result.worst_ratio, outcome.verdict.out.ratio)


def _record_finding(
    result: BackendResult, outcome: Outcome, backend: Backend, out_dir: Path | None, kernel_spec: str | None
) -> None:
    result.finding = outcome
    result.finding_dir = result.repro = None
    if out_dir is not None:
        result.finding_dir = save_finding(outcome, backend, out_dir, kernel_spec)
        result.repro = repro_command(str(result.finding_dir / "case.json"), backend.name, kernel_spec)
    result.findings.append(
        FindingRecord(
            outcome.case.case_id, outcome.status, outcome.message.splitlines()[0] if outcome.message else "",
            outcome.case.summary(), str(result.finding_dir) if result.finding_dir else None, result.repro,
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
    compile_budget: float | None = None,
) -> list[BackendResult]:
    """Fuzz ``backends`` one after another on ``shard``, continuing ``state`` and saving it to
    ``state_file`` after every chunk. ``examples`` is the campaign's total per backend (this shard
    runs its share); the time budget is shared by the backends that still have work and bounds a
    hanging case too. A backend that stopped at a finding is fuzzed again only with
    ``rerun_findings``. ``isolate`` None: ``pa_oracle.fuzz.run.isolation.isolated_by_default`` per backend.
    ``compile_budget`` (seconds, shared like the time budget): each backend draws inside a few compiled
    variants (``pa_oracle.fuzz.campaign.variants``); None draws without that restriction.
    ValueError for a ``case_timeout`` that is not a finite number > 0."""
    from pa_oracle.fuzz.run.isolation import check_timeout

    check_timeout(case_timeout)
    target = shard.share(examples)
    for backend in backends:
        state.results.setdefault(backend.name, BackendResult(backend.name, declared=declared(backend.capabilities, limits)))
    state.save(state_file)

    def wants_more(result: BackendResult) -> bool:
        if result.status == "finding":
            return rerun_findings
        return result.status != "exhausted" and result.examples < target

    todo = [b for b in backends if wants_more(state.results[b.name])]
    start = time.monotonic()
    label = f"[shard {shard}] " if shard.count > 1 else ""

    def checkpoint(result: BackendResult) -> None:
        state.results[result.backend] = result
        state.save(state_file)

    def report(result: BackendResult) -> None:
        if progress:
            total = sum(len(r.findings) for r in state.results.values())
            progress(f"  {label}{result.line()}; findings so far {total}")

    for i, backend in enumerate(todo):
        deadline = None if time_budget is None else start + time_budget * (i + 1) / len(todo)
        if progress:
            pinned = os.environ.get("CUDA_VISIBLE_DEVICES")
            where = f"{backend.device} (CUDA_VISIBLE_DEVICES={pinned})" if backend.device == "cuda" and pinned else backend.device
            progress(f"{label}fuzzing {backend.name} on {where} ...")
        compiling = sum(1 for b in todo if b.compile_fields) or 1  # the budget is shared by those that compile
        plan = None if compile_budget is None else plan_variants(
            backend, limits, budget=compile_budget / compiling, seed=int(state.config.get("seed", 0)) + shard.index
        )
        if plan is not None:
            plan.prebuild(progress)
        fuzz_backend(
            backend, examples=target, base_seed=int(state.config.get("seed", 0)), deadline=deadline, limits=limits,
            out_dir=out_dir, kernel_spec=backend.name if isinstance(backend, UserKernel) else None,
            progress=report, isolate=isolate, case_timeout=case_timeout, shard=shard, ledger=ledger,
            resume=state.results[backend.name], checkpoint=checkpoint, variants=plan,
        )
        if plan is not None:
            state.results[backend.name].coverage.variants = plan.lines()
    return [state.results[b.name] for b in backends]


def _crash_verdict(outcome: Outcome) -> Verdict:
    return Verdict(False, [f"crash: {outcome.message.splitlines()[0]}"])


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def save_finding(outcome: Outcome, backend: Backend, out_dir: Path, kernel_spec: str | None = None) -> Path:
    """Write case.json (+ tensors.npz sidecar) and report.md for a finding; return its folder.

    The folder is published whole (``pa_oracle.fuzz.campaign.outdir.publish_folder``): an existing folder is never
    replaced or deleted (the same finding found again is left as it was; a different one with
    the same case id goes beside it, ``CASE_ID-2``). Raises ``FindingNotSaved`` when it cannot be
    written, after rescuing the case.json to a temp folder if possible."""
    case = outcome.case
    meta = {
        "found_by": "pa-oracle fuzz",
        "backend": backend.name,
        "kernel": kernel_spec,
        "status": outcome.status,
        "message": outcome.message.splitlines()[0] if outcome.message else "",
        "versions": backend.versions(),
        "date": datetime.date.today().isoformat(),
        "generated_from": {"seed": case.seed, "distribution": case.distribution},
    }
    saved = case.replace(tensors_file="tensors.npz", meta=meta)
    parent = Path(out_dir) / _safe(backend.name)

    def write(tmp: Path, final: Path) -> None:
        save_tensors(make_tensors(case, "cpu"), tmp / "tensors.npz")
        saved.save(tmp / "case.json")
        repro = repro_command(str(final / "case.json"), backend.name, kernel_spec)
        report = format_report(case, backend.name, outcome.verdict or _crash_verdict(outcome), repro)
        if outcome.status == "crash":
            report += f"\n## Crash\n\n```\n{outcome.message}\n```\n"
        (tmp / "report.md").write_text(report)

    try:
        return publish_folder(parent, case.case_id, write, already_saved=lambda folder: holds_case(folder / "case.json", saved))
    except OSError as exc:
        finding = f"{backend.name} {outcome.status}: {meta['message']}; case {case.summary()}"
        rescued = rescue("case.json", json.dumps(saved.replace(tensors_file=None).to_json(), indent=1) + "\n")
        raise FindingNotSaved(parent, finding, exc, rescued) from exc
