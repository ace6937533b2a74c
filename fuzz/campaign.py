"""A fuzz campaign: Hypothesis draws cases a backend supports, ``check_case`` judges them, and the
first finding per backend is shrunk to a minimal case and saved (case.json + tensors.npz +
report.md) with a repro command.
"""

from __future__ import annotations

import datetime
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, given, reject, seed, settings
from hypothesis.errors import Flaky, Unsatisfiable

from backends.base import Backend
from fuzz.runner import Outcome, check_case
from fuzz.strategies import Limits, cases
from oracle.report import format_report, repro_command
from oracle.tensors import make_tensors, save_tensors
from oracle.tolerance import Tolerance, Verdict

CHUNK = 25  # examples per Hypothesis run; the time budget is checked between runs


class _Finding(Exception):
    pass


@dataclass
class BackendResult:
    backend: str
    examples: int = 0
    passed: int = 0
    unsupported: int = 0
    seconds: float = 0.0
    finding: Outcome | None = None
    finding_dir: Path | None = None
    repro: str | None = None
    worst_ratio: float = 0.0  # largest kernel/control max-error ratio among passing examples
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        rate = self.examples / self.seconds if self.seconds else 0.0
        state = "FINDING" if self.finding else "ok"
        return (
            f"{self.backend}: {state}, {self.examples} examples ({self.passed} passed, {self.unsupported} unsupported) "
            f"in {self.seconds:.1f}s ({rate:.1f}/s), worst error ratio {self.worst_ratio:.2f}"
        )


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
    progress: Callable[[str], None] | None = None,
    isolate_timeout: float | None = None,
) -> BackendResult:
    """Fuzz one backend until ``examples`` cases ran, the monotonic ``deadline`` passed, or a finding.

    With ``isolate_timeout`` every case runs in a worker process (``fuzz.isolation``): a crash of
    the process or a case taking longer than that many seconds is a finding, and the worker is
    restarted.
    """
    result = BackendResult(backend.name)
    isolated = None
    if isolate_timeout is not None:
        from fuzz.isolation import IsolatedBackend

        isolated = IsolatedBackend(backend, kernel_spec or backend.name, timeout=isolate_timeout)
    start = time.monotonic()
    strategy = cases(backend.capabilities, limits)
    failing: list[Outcome] = []

    def prop(case):  # type: ignore[no-untyped-def]
        if deadline is not None and time.monotonic() > deadline and not failing:
            reject()  # out of time: Hypothesis has no graceful stop, so the rest are discarded
        outcome = isolated.check(case) if isolated else check_case(backend, case, tolerance)
        if outcome.is_finding:
            failing.append(outcome)
            raise _Finding(outcome.message)
        if not failing:
            result.examples += 1
            result.passed += outcome.status == "pass"
            result.unsupported += outcome.status == "unsupported"
            if outcome.verdict is not None and outcome.verdict.out is not None:
                result.worst_ratio = max(result.worst_ratio, outcome.verdict.out.ratio)

    chunk = 0
    while result.examples < examples and (deadline is None or time.monotonic() < deadline):
        n = min(CHUNK, examples - result.examples)
        test = settings(
            max_examples=n, deadline=None, database=None, print_blob=False, report_multiple_bugs=False,
            phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck),
        )(seed(base_seed + chunk)(given(strategy)(prop)))
        before = result.examples
        try:
            test()
        except Unsatisfiable:
            pass  # every example of the chunk was rejected: the deadline passed
        except (_Finding, Flaky) as exc:
            if isinstance(exc, Flaky):
                result.notes.append("the failure did not reproduce on replay (flaky kernel): " + str(exc)[:200])
            result.examples += 1
            result.finding = failing[-1]
            break
        chunk += 1
        result.seconds = time.monotonic() - start
        if progress:
            progress(result.line())
        if result.examples == before:
            break  # the strategy drew nothing new
    if isolated is not None:
        isolated.close()
    result.seconds = time.monotonic() - start
    if result.finding and out_dir is not None:
        result.finding_dir = save_finding(result.finding, backend, out_dir, kernel_spec)
        result.repro = repro_command(str(result.finding_dir / "case.json"), backend.name, kernel_spec)
        (result.finding_dir / "report.md").write_text(
            format_report(result.finding.case, backend.name, result.finding.verdict or _crash_verdict(result.finding), result.repro)
            + (f"\n## Crash\n\n```\n{result.finding.message}\n```\n" if result.finding.status == "crash" else "")
        )
    return result


def _crash_verdict(outcome: Outcome) -> Verdict:
    return Verdict(False, [f"crash: {outcome.message.splitlines()[0]}"])


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def save_finding(outcome: Outcome, backend: Backend, out_dir: Path, kernel_spec: str | None = None) -> Path:
    """Write case.json (+ tensors.npz sidecar) for a finding; return its folder."""
    case = outcome.case
    folder = Path(out_dir) / _safe(backend.name) / case.case_id
    save_tensors(make_tensors(case, "cpu"), folder / "tensors.npz")
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
    case.replace(tensors_file="tensors.npz", meta=meta).save(folder / "case.json")
    return folder
