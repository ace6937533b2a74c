"""Campaigns of the checks beyond output values (``pa_oracle.fuzz.checks.metamorphic``, ``pa_oracle.fuzz.checks.plans``,
``pa_oracle.fuzz.checks.cuda_graphs``): Hypothesis draws cases a check can use; the first violation per backend
and check is shrunk and saved like a fuzz finding, with every case it involved (each with its
npz sidecar), a report and a repro command.
"""

from __future__ import annotations

import datetime
import json
import re
import shlex
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Flaky, Unsatisfiable
from pa_oracle.backends.base import Backend
from pa_oracle.fuzz.campaign.outdir import FindingNotSaved, holds_case, publish_folder, rescue
from pa_oracle.fuzz.checks.base import Check, CheckOutcome
from pa_oracle.fuzz.checks.cuda_graphs import GRAPH_CHECK
from pa_oracle.fuzz.checks.metamorphic import RELATIONS
from pa_oracle.fuzz.checks.plans import PLAN_CHECKS
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.run.runner import OracleDisagreement, call_kernel, describe_exception
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import make_tensors, save_tensors
from pa_oracle.oracle.tolerance import Tolerance

CHECKS: dict[str, Check] = {check.name: check for check in (*RELATIONS, *PLAN_CHECKS, GRAPH_CHECK)}


class _Violation(Exception):
    pass


@dataclass
class CheckResult:
    backend: str
    check: str
    examples: int = 0
    holds: int = 0
    exact: int = 0  # of the kernel-vs-kernel comparisons that held, how many were bit-exact
    skipped: int = 0
    seconds: float = 0.0
    not_applicable: str | None = None
    finding: CheckOutcome | None = None
    finding_dir: Path | None = None
    repro: str | None = None
    skip_reasons: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    incomplete: str | None = None  # why the run stopped early or judged nothing: never "ok"

    @property
    def is_complete(self) -> bool:
        return self.not_applicable is not None or self.incomplete is None

    def line(self) -> str:
        head = f"{self.backend} {self.check}"
        if self.not_applicable:
            return f"{head}: not applicable: {self.not_applicable}"
        state = f"VIOLATED ({self.finding.message.splitlines()[0][:160]})" if self.finding else "ok"
        if self.incomplete:
            state = f"INCOMPLETE ({self.incomplete[:160]})" + (f", {state}" if self.finding else "")
        skips = ""
        if self.skip_reasons:
            reason, count = self.skip_reasons.most_common(1)[0]
            skips = f" (most often: {reason[:90]!r} x{count})"
        return (
            f"{head}: {state}; {self.holds}/{self.examples} held ({self.exact} bit-exact), "
            f"{self.skipped} skipped{skips}, {self.seconds:.1f}s"
        )


def run_check(
    backend: Backend,
    check: Check,
    *,
    examples: int = 30,
    base_seed: int = 0,
    limits: Limits = Limits(),
    tolerance: Tolerance = Tolerance(),
    out_dir: Path | None = None,
    kernel_spec: str | None = None,
) -> CheckResult:
    """Run ``check`` on ``examples`` drawn cases; shrink and save the first violation."""
    result = CheckResult(backend.name, check.name)
    caps = check.capabilities(backend)
    if isinstance(caps, str):
        result.not_applicable = caps
        return result
    failing: list[CheckOutcome] = []
    start = time.monotonic()

    def prop(case: Case) -> None:
        outcome, raised = call_kernel(lambda: check(backend, case, tolerance))
        if raised is not None:  # SystemExit, KeyboardInterrupt, GeneratorExit ... of the kernel: a crash
            tb = "".join(traceback.format_exception(raised, limit=-4))
            message = f"{describe_exception(raised)} (raised by the kernel)\n{tb}"
            outcome = CheckOutcome(check.name, backend.name, "crash", message, [("original", case, None)])
        assert outcome is not None
        if outcome.is_finding:
            failing.append(outcome)
            raise _Violation(outcome.message)
        if failing:
            return  # shrinking: not part of the counts
        result.examples += 1
        if outcome.status == "skipped":
            result.skipped += 1
            result.skip_reasons[outcome.message.splitlines()[0]] += 1
        else:
            result.holds += 1
            result.exact += bool(outcome.exact)

    test = settings(
        max_examples=examples, deadline=None, database=None, print_blob=False, report_multiple_bugs=False,
        phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck),
    )(seed(base_seed)(given(cases(caps, limits))(prop)))
    try:
        test()
    except Unsatisfiable:
        result.incomplete = "every drawn case was rejected"
    except (_Violation, Flaky) as exc:
        if isinstance(exc, Flaky):
            result.notes.append("the violation did not reproduce on replay (flaky kernel): " + str(exc)[:200])
        if failing:
            result.examples += 1
            result.finding = failing[-1]
        else:
            result.incomplete = "Hypothesis reported a flaky test without a violation: " + str(exc)[:200]
    except Exception as exc:  # noqa: BLE001 - an internal error: this check stops, the others go on
        if isinstance(exc, OracleDisagreement):
            raise
        result.incomplete = f"internal error: {type(exc).__name__}: {exc}"
    if result.incomplete is None and not result.finding and result.holds == 0:
        result.incomplete = "no example was judged" if not result.examples else f"all {result.examples} examples were skipped"
    result.seconds = time.monotonic() - start
    if result.finding and out_dir is not None:
        result.finding_dir, result.repro = save_check_finding(result.finding, backend, out_dir, kernel_spec)
    return result


def repro_command(case_path: Path, check: str, backend: str, kernel: str | None) -> str:
    args = ["pa-oracle", "metamorphic", "--case", str(case_path), "--check", check]
    args += ["--kernel", kernel] if kernel else ["--backend", backend]
    return shlex.join(args)


def save_check_finding(
    outcome: CheckOutcome, backend: Backend, out_dir: Path, kernel_spec: str | None = None
) -> tuple[Path, str]:
    """Write every case of ``outcome`` (case.json + tensors.npz per label) and report.md, published
    whole under a free name like fuzz findings (``pa_oracle.fuzz.campaign.outdir.publish_folder``: nothing is replaced)."""
    original = outcome.cases[0][1]
    parent = Path(out_dir) / re.sub(r"[^A-Za-z0-9_.-]+", "_", backend.name)
    meta = {
        "found_by": f"pa-oracle metamorphic --check {outcome.check}",
        "backend": backend.name,
        "kernel": kernel_spec,
        "status": outcome.status,
        "message": outcome.message.splitlines()[0],
        "versions": backend.versions(),
        "date": datetime.date.today().isoformat(),
    }
    repro = ""  # set by same() or write(): the repro names the folder the finding ends up in
    labelled = [(label, case.replace(tensors_file="tensors.npz", meta={**meta, "role": label})) for label, case, _ in outcome.cases]

    def same(folder: Path) -> bool:
        nonlocal repro
        if all(holds_case(folder / label / "case.json", case) for label, case in labelled):
            repro = repro_command(folder / "original" / "case.json", outcome.check, backend.name, kernel_spec)
            return True
        return False

    def write(tmp: Path, final: Path) -> None:
        nonlocal repro
        for (label, case, tensors), (_, saved) in zip(outcome.cases, labelled):
            save_tensors(tensors if tensors is not None else make_tensors(case, "cpu"), tmp / label / "tensors.npz")
            saved.save(tmp / label / "case.json")
        repro = repro_command(final / "original" / "case.json", outcome.check, backend.name, kernel_spec)
        (tmp / "report.md").write_text(format_check_report(outcome, repro))

    try:
        folder = publish_folder(parent, f"{outcome.check}-{original.case_id}", write, already_saved=same)
    except OSError as exc:
        case_json = labelled[0][1].replace(tensors_file=None).to_json()
        finding = f"{backend.name} {outcome.check} {outcome.status}: {meta['message']}; case {original.summary()}"
        raise FindingNotSaved(parent, finding, exc, rescue("case.json", json.dumps(case_json, indent=1) + "\n")) from exc
    return folder, repro


def format_check_report(outcome: CheckOutcome, repro: str | None = None) -> str:
    """Markdown: the check and its expectation, what happened, where, the cases, the repro."""
    check = CHECKS.get(outcome.check)
    original = outcome.cases[0][1]
    lines = [f"# {outcome.backend}: {outcome.check} {outcome.status.upper()} on case {original.case_id}", ""]
    if check is not None:
        lines.append(f"- expected: {check.expect} ({check.why})")
    lines += [f"- {line}" for line in outcome.message.splitlines()[:1]]
    if outcome.worst is not None:
        lines.append(f"- largest difference at {outcome.worst.describe()}")
    if repro:
        lines += ["", "To recreate this report, run:", "", f"    {repro}"]
    lines += ["", "## Cases", ""]
    for label, case, _ in outcome.cases:
        lay = case.layout
        lines += [
            f"- **{label}** (`{label}/case.json`): {case.summary()}",
            f"  - qo_indptr {list(lay.qo_indptr)}; kv_indptr {list(lay.kv_indptr)}",
            f"  - kv_indices {list(lay.kv_indices)}; kv_last_page_len {list(lay.kv_last_page_len)}",
        ]
    if outcome.status == "crash":
        lines += ["", "## Crash", "", "```", outcome.message, "```"]
    return "\n".join(lines) + "\n"
