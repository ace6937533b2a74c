"""One triage run: survey the backends on a case, minimize it for one failing backend, localize
the error on the minimized and the original case (and, when they are ambiguous, on the finding's
first failing case before shrinking, ``original.json``), and write the report files."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pa_oracle.backends.base import Backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.finding_record import FIRST_FAILING, FindingMeta, FoundBy, meta_of, read_first_failing, today
from pa_oracle.fuzz.campaign.findings import first_line, ratio_words, repro_command
from pa_oracle.fuzz.campaign.minimize import HANG, TRIAGE_RUNS, Minimized, minimize
from pa_oracle.fuzz.campaign.strength import QUANTITIES, kept, required_ratio, strengths
from pa_oracle.fuzz.campaign.workload import Workload
from pa_oracle.fuzz.run.isolation import default_case_timeout
from pa_oracle.fuzz.run.judge import case_judge
from pa_oracle.fuzz.run.runner import Outcome
from pa_oracle.fuzz.triage.localize import Localization, capture, localize
from pa_oracle.fuzz.triage.necessity import necessary_options
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import load_case
from pa_oracle.oracle.tolerance import Tolerance


@dataclass(frozen=True)
class SurveyRow:
    backend: str
    status: str  # pass, fail, crash, unsupported
    message: str

    @property
    def agrees(self) -> bool:
        return self.status == "pass"


@dataclass
class Triage:
    source: Path
    case: Case
    survey: list[SurveyRow]
    focus: str | None = None  # the failing backend that was minimized and localized
    kernel_spec: str | None = None  # set when the focus is a user kernel
    minimized: Minimized | None = None
    minimized_path: Path | None = None
    localized: list[tuple[str, Localization]] = field(default_factory=list)  # (which case, result)
    first: Outcome | None = None  # the focus's outcome on the case as given (the survey's)

    @property
    def outcome(self) -> Outcome | None:
        """The one verdict every report states: the minimized case's when it was reduced, else the case's."""
        if self.minimized is not None and self.minimized.reduced:
            return self.minimized.outcome
        return self.first

    @property
    def failing(self) -> list[SurveyRow]:
        return [row for row in self.survey if row.status in ("fail", "crash")]

    @property
    def case_path(self) -> Path:
        """The case the regression test should load: the minimized one if any."""
        return self.minimized_path or self.source

    @property
    def repro(self) -> str | None:
        if self.focus is None:
            return None
        return repro_command(str(self.case_path), self.focus, self.kernel_spec)


def survey(
    case: Case, backends: list[Backend], tolerance: Tolerance = Tolerance(), progress: Callable[[str], None] | None = None
) -> list[SurveyRow]:
    return [row for row, _ in _survey(case, backends, tolerance, progress)]


def _survey(
    case: Case, backends: list[Backend], tolerance: Tolerance, progress: Callable[[str], None] | None
) -> list[tuple[SurveyRow, Outcome]]:
    """Each backend's row and outcome on ``case``, judged as fuzz judges it (isolated by default),
    keeping the output: localization reuses the focus's outcome instead of running it again."""
    rows = []
    for backend in backends:
        if progress:
            progress(f"running {backend.name} ...")
        with case_judge(backend, timeout=default_case_timeout(), tolerance=tolerance, keep_output=True) as check:
            outcome = check(case)
        message = outcome.message.splitlines()[0] if outcome.message else ""
        rows.append((SurveyRow(backend.name, outcome.status, message), outcome))
    return rows


def pick_focus(meta: FindingMeta, rows: list[SurveyRow]) -> str | None:
    """The backend to minimize for: the one that found the case if it still fails, else the first failing."""
    failing = [row.backend for row in rows if row.status in ("fail", "crash")]
    for preferred in (meta.kernel, meta.backend):
        if preferred in failing:
            return preferred
    return failing[0] if failing else None


def run_triage(
    case: Case,
    source: Path,
    backends: list[Backend],
    out_dir: Path,
    *,
    minimize_case: bool = True,
    budget: int = TRIAGE_RUNS,
    tolerance: Tolerance = Tolerance(),
    progress: Callable[[str], None] | None = None,
) -> Triage:
    say = progress or (lambda _: None)
    surveyed = _survey(case, backends, tolerance, say)
    result = Triage(Path(source), case, [row for row, _ in surveyed])
    result.focus = pick_focus(meta_of(case, source), result.survey)
    if result.focus is None:
        return result
    backend = next(b for b in backends if b.name == result.focus)
    result.kernel_spec = backend.name if isinstance(backend, UserKernel) else None
    first = result.first = next(outcome for row, outcome in surveyed if row.backend == backend.name)
    if minimize_case and first.message.startswith(HANG):
        say("not minimizing a hang: every candidate that hangs costs a whole case timeout")
        minimize_case = False
    judge = case_judge(backend, timeout=default_case_timeout(), tolerance=tolerance, keep_output=True)
    with judge as check:  # one worker for minimization and localization

        def judged(candidate: Case) -> Outcome:
            return first if candidate is case else check(candidate)  # the survey judged the original already

        _minimize_and_localize(result, case, backend, out_dir, judged, minimize_case, budget, tolerance, say)
    return result


def _minimize_and_localize(
    result: Triage, case: Case, backend: Backend, out_dir: Path, check: Callable[[Case], Outcome],
    minimize_case: bool, budget: int, tolerance: Tolerance, say: Callable[[str], None],
) -> None:
    if minimize_case:
        say(f"minimizing for {backend.name} (budget {budget} kernel runs) ...")
        result.minimized = minimize(
            backend, Workload.from_case(case), budget=budget, tolerance=tolerance, progress=say, check=check
        )
        if result.minimized.reduced:
            outcome = result.minimized.outcome
            meta = FindingMeta(found_by=FoundBy(
                command="pa-oracle triage", backend=backend.name, kernel=result.kernel_spec, status=outcome.status,
                message=first_line(outcome.message), versions={k: str(v) for k, v in backend.versions().items()},
                date=today()), minimized_from=case.case_id)
            result.minimized_path = result.minimized.work.save(Path(out_dir) / "minimized", meta)
            minimized_case = load_case(result.minimized_path)
            judged = _judged_once(minimized_case, outcome, check)  # its verdict is the one the reports state
            result.localized.append(("minimized case", _localized(backend, minimized_case, tolerance, judged, say)))
    say(f"localizing on {backend.name} ...")
    result.localized.append(("original case", localize(capture(backend, case, tolerance, check))))
    if len(result.localized) == 1:  # not minimized: say which options the case as given needs
        result.localized[0][1].checks.append(necessary_options(case, backend, check))
    if any(c.result == "ambiguous" for _, loc in result.localized for c in loc.checks):
        larger = read_first_failing(result.source, say)
        if larger is not None and larger.case_id != case.case_id:
            say(f"ambiguous on the minimal case: localizing on the first failing case ({FIRST_FAILING}) ...")
            result.localized.append((f"first failing case, {FIRST_FAILING}", localize(capture(backend, larger, tolerance, check))))


def verdict_line(outcome: Outcome) -> str:
    """An outcome's failing quantities with their ratios (``out max error 0.000332 > 1.84e-07 allowed (1,804x)``),
    else its first line (a crash, a contract breach)."""
    found = strengths(outcome.verdict)
    return "; ".join(s.describe() for s in found) if found else first_line(outcome.message)


def as_found(result: Triage) -> str:
    """What the case as given showed when the reports state a minimized case ('' otherwise), and by how much the
    minimized one is weaker, if it is (``strength``'s rule bounds it)."""
    m = result.minimized
    if m is None or not m.reduced or result.first is None:
        return ""
    text = f"The case as given, before minimization ({m.original.case.summary()}): {verdict_line(result.first)}."
    weaker = weakening(m)
    return text + (f" The minimized case is weaker: {', '.join(weaker)}." if weaker else "")


def weakening(m: Minimized) -> list[str]:
    """Each kept quantity the minimized case fails less strongly than the original: ``output 105x -> 18.43x
    (kept >= 10.50x)``."""
    after = {s.quantity: s for s in strengths(m.outcome.verdict)}
    return [f"{QUANTITIES[s.quantity]} {ratio_words(s.ratio)}x -> {ratio_words(after[s.quantity].ratio)}x "
            f"(kept >= {ratio_words(required_ratio(s.ratio))}x)"
            for s in kept(m.signature.strengths) if s.quantity in after and after[s.quantity].ratio < s.ratio]


def _judged_once(case: Case, outcome: Outcome, check: Callable[[Case], Outcome]) -> Callable[[Case], Outcome]:
    """``check``, but ``outcome`` for ``case`` itself: the minimizer judged it already (the same values), and a
    second run could state other numbers (a kernel that is not deterministic)."""
    return lambda candidate: outcome if candidate is case else check(candidate)


def issue_clues(localized: list[tuple[str, Localization]]) -> list[str]:
    """The localization lines ISSUE.md lists: the first case's (the minimized one if any) patterns, each as
    ``NAME: FINDING``; a clue it leaves ambiguous that a later, larger case (the original, the finding's first
    failing case) resolves into a pattern of the same check is given as that pattern, naming the case it was read
    on. Without this the report of a window off by one said only that a one-key case cannot tell it from the
    first key, while triage had located it on the first failing case."""
    if not localized:
        return []
    lines = []
    for clue in localized[0][1].patterns:
        resolved = next(((label, loc, c) for label, loc in localized[1:] for c in loc.checks
                         if c.name == clue.name and c.result == "pattern"), None)
        if clue.result != "ambiguous" or resolved is None:
            lines.append(f"{clue.name}: {clue.finding}")
            continue
        _, loc, found = resolved
        lines.append(f"{found.name}: {found.finding} (read on a larger failing case, {loc.case.summary()}; the minimal "
                     f"case cannot tell it apart: {clue.finding.split(': ', 1)[0]})")
    return lines


def _localized(backend: Backend, case: Case, tolerance: Tolerance, check: Callable[[Case], Outcome],
               say: Callable[[str], None]) -> Localization:
    """Localize ``case`` and say which of its options the failure needs (a kernel run per option on)."""
    loc = localize(capture(backend, case, tolerance, check))
    say("turning each option off ...")
    loc.checks.append(necessary_options(case, backend, check))
    return loc
