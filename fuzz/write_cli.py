"""What ``pa-oracle writes`` (``pa_oracle.fuzz.cli.writes``: ``pa-oracle fuzz --check write`` with the write
defaults, through ``run_fuzz`` as ``metamorphic``) has of its own: the lines it prints for a write kernel
(``result_line``), and reading and judging a saved write case (``writes --case``, ``pa-oracle replay`` of a write
finding). The write kernels are ``pa_oracle.backends.writes``'s (``-b NAME``, an entry point, or ``--kernel
MODULE:NAME``), judged byte for byte by the write check (``pa_oracle.fuzz.checks.append.WRITE``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pa_oracle.fuzz.campaign.write_files import read_saved_write
from pa_oracle.fuzz.exits import FINDING, NO_FINDING

if TYPE_CHECKING:
    from pa_oracle.backends import Backend
    from pa_oracle.fuzz.campaign.state import BackendResult
    from pa_oracle.oracle.append import AppendCase

STATE_FILE = "writes-state.json"  # the write campaign's state in --out (pa_oracle.fuzz.cli.WRITES_CAMPAIGN + ".json")

def result_line(result: BackendResult) -> str:
    """A write kernel's line: ``NAME ok   N examples[ (time budget)], S s``, ``NAME FAIL STATUS (after N
    examples): DETAIL`` (STATUS: fail, mutated, crash or hang) or ``NAME INCOMPLETE after N examples: WHY``."""
    from pa_oracle.fuzz.checks.append import MUTATED

    name = f"{result.backend:28s}"
    if result.findings:
        f = result.findings[-1]
        status = "hang" if f.message.startswith("hang:") else "mutated" if f.message.startswith(MUTATED) else f.status
        detail = f.message.removeprefix(MUTATED)
        return f"{name} FAIL {status} (after {result.examples} examples): {detail}"
    if not result.is_complete:
        why = result.judged_nothing() or (result.notes[-1] if result.notes else result.status)
        return f"{name} INCOMPLETE after {result.examples} examples: {why}"
    budget = " (time budget)" if result.status == "running" else ""
    return f"{name} ok   {result.examples} examples{budget}, {result.seconds:.1f} s"


def result_lines(results: list[BackendResult]) -> list[str]:
    """Each write kernel's ``result_line``, and under a finding where it is saved and the command that replays it."""
    lines = []
    for result in results:
        lines.append(result_line(result))
        lines += [f"    saved {f.dir}; replay: {f.repro}" for f in result.findings if f.dir]
    return lines


def judge_saved_write(backend: Backend, case: AppendCase, isolate: bool | None, timeout: float) -> Any:
    """The write check's ``Outcome`` for ``case`` on ``backend``, isolated as a campaign runs it
    (``pa_oracle.fuzz.run.judge.case_judge``; ``isolate`` None: the kernel's default)."""
    from pa_oracle.fuzz.checks.append import WRITE, engine_case
    from pa_oracle.fuzz.run.judge import case_judge

    with case_judge(backend, isolate=isolate, timeout=timeout, judge=WRITE) as judge:
        return judge(engine_case(case))




def replay_write_finding(saved: Path, names: tuple[str, ...], kernels: tuple[str, ...]) -> tuple[str, int]:
    """``pa-oracle replay`` of a write finding: (the verdict's line, the exit code: 1 a finding, 3 no verdict, 0 a
    pass). The kernel is ``names``/``kernels``, else the registered one its record names (a user kernel named
    there is never imported: bad input asking for ``--kernel``)."""
    from pa_oracle.backends import resolve
    from pa_oracle.fuzz.campaign.finding_record import read_meta
    from pa_oracle.fuzz.run.isolation import default_case_timeout

    case, recorded = read_saved_write(saved)
    if not names and not kernels:
        meta = recorded if recorded is not None else read_meta({}, saved)
        if meta.kernel:
            raise click.UsageError(f"{saved} was found on the user write kernel {meta.kernel}; a case file imports no "
                                   f"code by itself: to replay it there, pass --kernel {meta.kernel}")
        if not meta.backend:
            raise click.UsageError(f"{saved} names no kernel that found it (meta.found_by.backend): give --backend NAME")
        names = (meta.backend,)
    backend = resolve(names, kernels, kind="write")[0]
    outcome = judge_saved_write(backend, case, None, default_case_timeout())
    code = FINDING if outcome.is_finding else 3 if outcome.status in ("error", "unsupported") else NO_FINDING
    return f"{backend.name}: {outcome.status.upper()}: {outcome.message}", code
