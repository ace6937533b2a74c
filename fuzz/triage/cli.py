"""``pa-oracle triage`` and ``pa-oracle golden add`` (registered on the main group in ``pa_oracle.fuzz.cli``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from pa_oracle.fuzz.campaign.ledger import GOLDEN
from pa_oracle.fuzz.campaign.outdir import OwnFiles
from pa_oracle.oracle.case import Case, CaseError

if TYPE_CHECKING:
    from pa_oracle.backends.base import Backend
    from pa_oracle.fuzz.campaign.finding_record import FindingMeta
    from pa_oracle.fuzz.run.runner import Outcome
    from pa_oracle.fuzz.triage.pipeline import Triage
    from pa_oracle.fuzz.triage.upstream import Seen
    from pa_oracle.fuzz.triage.writes import WriteTriage


@click.command()
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option("--backend", "-b", "backend_names", multiple=True, help="Backend name (repeatable). Default: every available one.")
@click.option("--kernel", "-k", "kernels", multiple=True, help="A user kernel as MODULE:FUNCTION (repeatable).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Report folder. Default: FINDING_DIR/triage, or pa-triage/<case id> for a case file.")
@click.option("--no-minimize", is_flag=True, help="Skip delta debugging; localize the case as given.")
@click.option("--budget", default=200, show_default=True, help="Kernel runs the minimization may spend.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of text.")
@click.option("--cross-check", "cross_check", type=click.Choice(["built", "all"]), default="built", show_default=True,
              help="Without -b/-k: run the case on the other available backends only where its variant is built "
                   "(prebuilt or cached), or on all of them (compiling each one's variant first, together).")
@click.option("--upstream", "upstream_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also write DIR/repro.py (standalone: torch, numpy and the kernel's library) and DIR/ISSUE.md.")
def triage(**options: Any) -> None:
    """Run CASE.json or FINDING_DIR on the backends, minimize it for a failing one, locate the
    error and write triage.md / triage.html; exit 1 if any backend fails the case. A write finding
    (writes.json or its folder) is run on its one write kernel, minimized and localized the same way."""
    run_triage_command(TriageOptions(**options))


@dataclass(frozen=True)
class TriageOptions:
    """What ``triage`` was asked, as the command line gave it."""

    source: Path
    backend_names: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    out_dir: Path | None = None
    no_minimize: bool = False
    budget: int = 200
    as_json: bool = False
    cross_check: str = "built"
    upstream_dir: Path | None = None


def run_triage_command(opts: TriageOptions) -> None:
    """The triage command's body: read the finding, choose and build the backends, triage, write, say, exit."""
    from pa_oracle.fuzz.campaign.finding_record import read_finding
    from pa_oracle.fuzz.triage.pipeline import run_triage
    from pa_oracle.fuzz.triage.render import write_report
    from pa_oracle.fuzz.campaign.write_files import write_finding_path

    if (saved := write_finding_path(opts.source)) is not None:  # a write kernel's finding
        click.get_current_context().exit(run_write_triage(opts, saved))
    finding = read_finding(opts.source)  # bad input (a FindingError or CaseError naming the file) exits 2
    case = finding.case
    if opts.budget < 1:
        raise click.UsageError("--budget must be >= 1")
    say = (lambda _: None) if opts.as_json else (lambda line: click.echo(line, err=True))
    backends, missing = _triage_backends(opts, finding.case, finding.meta, say)
    _build_variants(case, backends, say)
    out_dir = opts.out_dir or (opts.source / "triage" if opts.source.is_dir() else Path("pa-triage") / case.case_id)
    with triage_files(out_dir).writing():  # a user's file there: exit 2 before anything runs
        result = run_triage(case, finding.case_json, backends, out_dir, minimize_case=not opts.no_minimize,
                            budget=opts.budget, progress=say)
        written = write_report(result, out_dir)
    if opts.upstream_dir is not None:
        written.update(_write_upstream(result, backends, opts.upstream_dir))
    if opts.as_json:
        click.echo(json.dumps(_summary(result, written), indent=1))
    else:
        _print_triage(result, written, missing)
    if any(row.status == "error" for row in result.survey) or all(row.status == "unsupported" for row in result.survey):
        sys.exit(3)  # a backend the tool could not judge, or no verdict at all
    if result.failing:
        sys.exit(1)


def run_write_triage(opts: TriageOptions, saved_path: Path) -> int:
    """Triage of a write finding (``pa_oracle.fuzz.triage.writes``) on its kernel: ``-b NAME`` or ``--kernel``, else
    the registered kernel its record names (a user kernel it names is never imported: bad input asking for
    ``--kernel``). Exit 1 when it reproduces, 0 when it does not, 3 when it could not be judged."""
    from pa_oracle.backends import BackendSpecError, resolve
    from pa_oracle.fuzz.triage.write_report import write_write_report
    from pa_oracle.fuzz.triage.writes import read_write_finding, triage_write

    saved = read_write_finding(saved_path)
    if opts.budget < 1:
        raise click.UsageError("--budget must be >= 1")
    names, kernels = opts.backend_names, opts.kernels
    if not names and not kernels:
        if saved.meta.kernel:
            raise click.UsageError(f"{saved_path} was found on the user write kernel {saved.meta.kernel}; a finding imports "
                                   f"no code by itself: to triage it there, pass --kernel {saved.meta.kernel}")
        if not saved.meta.backend:
            raise click.UsageError(f"{saved_path} names no kernel that found it (meta.found_by.backend): give -b NAME")
        names = (saved.meta.backend,)
    try:
        backends = resolve(names, kernels, kind="write")
    except BackendSpecError as exc:
        raise click.UsageError(str(exc)) from None
    if len(backends) != 1:
        raise click.UsageError(f"a write finding is triaged on one kernel; {len(backends)} were given")
    say = (lambda _: None) if opts.as_json else (lambda line: click.echo(line, err=True))
    out_dir = opts.out_dir or saved_path.parent / "triage"
    with triage_files(out_dir).writing():
        result = triage_write(saved, backends[0], out_dir, minimize_case=not opts.no_minimize, budget=opts.budget,
                              progress=say)
        report = write_write_report(result, out_dir)
    _print_write_triage(result, report, opts.as_json)
    if result.outcome.status in ("error", "unsupported"):
        return 3
    return 1 if result.reproduced else 0


# what triage writes under --out (either kind of finding): it replaces only these, and only its own
TRIAGE_FILES = ("triage.md", "triage.html", "test_regression.py", "plots/*.png", "minimized/case.json",
                "minimized/tensors.npz", "minimized/writes.json")


def triage_files(out_dir: Path) -> OwnFiles:
    """Triage's files under ``out_dir`` (``OwnFiles``: a user's file of those names is refused, exit 2)."""
    return OwnFiles(out_dir, TRIAGE_FILES, "pa-oracle triage", _older_triage)


def _older_triage(folder: Path) -> bool:
    """Whether ``folder`` holds a report of a triage that kept no record of its files (its first line)."""
    try:
        with open(folder / "triage.md", encoding="utf-8", errors="replace") as f:
            return f.readline().startswith(("# Triage of case ", "# Write triage: "))
    except OSError:
        return False


def _print_write_triage(result: WriteTriage, report: Path, as_json: bool) -> None:
    m, final = result.minimized, result.final_case
    replay = result.replay(result.minimized_path.parent) if result.minimized_path else None
    if as_json:
        click.echo(json.dumps({
            "backend": result.backend, "reproduced": result.reproduced, "status": result.outcome.status,
            "message": result.outcome.message, "case": result.saved.case.case_id,
            "minimized": None if m is None else {"case": final.to_json(), "runs": m.runs, "budget": m.budget,
                                                 "exhausted": m.exhausted, "steps": [s.description for s in m.steps],
                                                 "path": str(result.minimized_path) if result.minimized_path else None},
            "localization": {label: {"kinds": loc.kinds, "requests": loc.requests, "rows": len(loc.rows)}
                             for label, _, loc in result.localized},
            "replay": replay, "report": str(report)}, indent=1))
        return
    click.echo(f"{result.backend:32s} {'REPRODUCED' if result.reproduced else 'NOT REPRODUCED'}: "
               f"{result.outcome.status}: {first_line_of(result.outcome.message)}")
    if m is not None:
        click.echo(f"minimized in {m.runs} runs: {final.summary()}")
    for label, _, loc in result.localized:
        click.echo(f"  [{label}] wrong bytes: {', '.join(loc.kinds)}; {len(loc.rows)} rows, requests {loc.requests}")
    click.echo(f"\nreport: {report}")
    if replay:
        click.echo(f"replay: {replay}")


def first_line_of(text: str) -> str:
    return text.splitlines()[0] if text else ""


def _triage_backends(opts: TriageOptions, case: Case, meta: FindingMeta,
                     say: Callable[[str], None]) -> tuple[list[Backend], dict[str, str]]:
    """The backends triage runs (``-b``/``-k``, else every available one plus the user kernel that found the
    case, those whose variant is not built left out unless ``--cross-check all``) and the unavailable ones."""
    from pa_oracle.backends import BackendSpecError, available, resolve

    missing: dict[str, str] = {}
    try:
        if opts.backend_names or opts.kernels:
            return resolve(opts.backend_names, opts.kernels), missing
        backends, missing = available()
        if meta.kernel:  # the user kernel that found the case is in no registry
            backends += resolve((), (meta.kernel,))
    except BackendSpecError as exc:
        raise click.UsageError(str(exc)) from None
    if opts.cross_check == "built":
        backends, unbuilt = _with_built_variants(backends, case, meta)
        if unbuilt:
            say(f"not cross-checked ({len(unbuilt)} backends whose variant of this case is not built here; "
                f"--cross-check all builds and runs them): {', '.join(unbuilt)}")
    return backends, missing


def _print_triage(result: Triage, written: dict[str, Path], missing: dict[str, str]) -> None:
    from pa_oracle.fuzz.triage.pipeline import verdict_line, weakening

    for row in result.survey:
        verdict = {"pass": "agrees", "fail": "DISAGREES", "crash": "CRASHES", "unsupported": "unsupported", "error": "ERROR"}[row.status]
        click.echo(f"{row.backend:32s} {verdict:12s} {row.message if row.status != 'pass' else ''}".rstrip())
    if missing:
        click.echo(f"({len(missing)} more backends are unavailable here: pa-oracle env says why)")
    if result.minimized is not None:
        m = result.minimized
        click.echo(f"\nminimized for {result.focus} in {m.runs} runs: {m.work.case.summary()}")
        if m.reduced:
            click.echo(f"  fails: {verdict_line(m.outcome)}")
            for line in weakening(m):
                click.echo(f"  weaker than the case as given: {line}")
    for label, loc in result.localized:
        for check in loc.patterns:
            click.echo(f"  [{label}] {check.name}{' (ambiguous)' if check.result == 'ambiguous' else ''}: {check.finding}")
    click.echo(f"\nreport: {written['markdown']}  {written['html']}")
    for key, what in (("upstream issue", "ISSUE.md"), ("upstream repro", "repro.py"), ("upstream inputs", "inputs.npz")):
        if key in written:
            click.echo(f"wrote {what}: {written[key]}")
    if result.repro:
        click.echo(f"repro:  {result.repro}")


def _with_built_variants(backends: list[Backend], case: Case, meta: FindingMeta) -> tuple[list[Backend], list[str]]:
    """The backends that run ``case`` on a built variant (or compile nothing), the one that found it (``meta``)
    always kept; and the names of the others."""
    own = {meta.backend, meta.kernel}
    kept: list[Backend] = []
    left: list[str] = []
    for backend in backends:
        try:
            ready = backend.name in own or not backend.compile_fields or backend.unsupported_reason(case) is not None \
                or backend.built_reason(backend.compile_key(case)) is not None
        except Exception:  # noqa: BLE001 - an adapter that cannot say: run it, as before
            ready = True
        if ready:
            kept.append(backend)
        else:
            left.append(backend.name)
    return kept, left


def _build_variants(case: Case, backends: list[Backend], say: Callable[[str], None]) -> None:
    """Build the case's variant on every backend that will run it, together, before triage runs it."""
    from pa_oracle.fuzz.campaign.compile_plan import build_everything, corpus_plan
    from pa_oracle.fuzz.run.isolation import isolatable

    plan = corpus_plan([case], backends)
    if any(p.chosen for p in plan.plans.values()):
        say(f"built the case's variants in {build_everything(plan, isolatable, say):.1f}s")


def _write_upstream(result: Triage, backends: list[Backend], upstream_dir: Path) -> dict[str, Path]:
    """The upstream repro of the focus backend on the case triage ends with (the minimized one if any), stating
    the verdict triage.md states (``Triage.outcome``)."""
    import torch
    from pa_oracle.fuzz.triage.pipeline import issue_clues
    from pa_oracle.fuzz.triage.upstream import NoUpstreamRepro, write_upstream
    from pa_oracle.oracle.tensors import load_case

    if result.focus is None or result.outcome is None:
        click.echo("no upstream repro: no backend fails the case", err=True)
        return {}
    backend = next(b for b in backends if b.name == result.focus)
    case, outcome = load_case(result.case_path), result.outcome
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() and backend.device == "cuda" else "cpu"
    if case.storage is not None:  # the standalone script hands contiguous tensors: use the default storage if it still fails
        from pa_oracle.fuzz.run.runner import check_case

        plain = check_case(backend, case.replace(storage=None))
        if plain.status in ("fail", "crash"):
            click.echo(f"upstream repro: the case fails in the default storage too ({plain.status}); written for it: "
                       f"{first_line_of(plain.message)}", err=True)
            case, outcome = case.replace(storage=None), plain
    try:
        return {f"upstream {k}": v for k, v in write_upstream(upstream_dir, case, backend, _seen(result, case, outcome, backend, gpu),
                                                             findings=issue_clues(result.localized)).items()}
    except NoUpstreamRepro as exc:
        click.echo(str(exc), err=True)
        return {}


def _seen(result: Triage, case: Case, outcome: Outcome, backend: Backend, gpu: str) -> Seen:
    """What ISSUE.md and repro.py state: ``outcome``'s verdict (its limits, a few wrong elements), the options the
    failure needs and, for a minimized case, what the case as given showed."""
    from pa_oracle.fuzz.triage.necessity import needed
    from pa_oracle.fuzz.triage.pipeline import as_found
    from pa_oracle.fuzz.triage.upstream import Seen, wrong_elements

    verdict = outcome.verdict
    elements = wrong_elements(case, outcome.output, verdict) if verdict is not None and outcome.output is not None else ()
    clue = next((c for _, loc in result.localized[:1] for c in loc.checks if c.name == "options needed"), None)
    return Seen(outcome.status, outcome.message, backend.versions(), gpu, verdict, elements,
                needed(clue) if clue is not None else (), as_found(result))


def _summary(result: Triage, written: dict[str, Path]) -> dict[str, Any]:
    from pa_oracle.fuzz.triage.pipeline import verdict_line, weakening

    m = result.minimized
    return {
        "case": result.case.case_id,
        "backends": [{"backend": r.backend, "status": r.status, "message": r.message} for r in result.survey],
        "focus": result.focus,
        "minimized": None if m is None else {
            "case": m.work.case.summary(), "path": str(result.minimized_path) if result.minimized_path else None,
            "runs": m.runs, "budget": m.budget, "exhausted": m.exhausted, "steps": [s.description for s in m.steps],
            "fails": verdict_line(m.outcome), "weaker": weakening(m),
        },
        "localization": {
            label: [{"check": c.name, "result": c.result, "finding": c.finding, "evidence": list(c.evidence)} for c in loc.checks]
            for label, loc in result.localized
        },
        "repro": result.repro,
        "report": {k: str(v) for k, v in written.items()},
    }


@click.group()
def golden() -> None:
    """The regression corpus (golden/cases + golden/ledger.json)."""


@golden.command("add")
@click.argument("finding", type=click.Path(exists=True, path_type=Path))
@click.option("--name", help="Golden case name (file stem). Default: <backend>-<case id>.")
@click.option("--reason", help="What is wrong, on which kernel and version, where it was seen (required).")
@click.option("--issue", help="URL of the issue or PR that tracks it (required).")
@click.option("--status", type=click.Choice(["tolerated", "quarantine", "quarantined"]), default="tolerated", show_default=True,
              help="tolerated: still runs and must still fail; quarantine(d): never launched (crashers).")
@click.option("--backend", "-b", "backends", multiple=True, help="Backends the entry covers (default: the finding's).")
@click.option("--check", "check", default=None, help="The check that judges the case (default: the one that found it, else the oracle).")
@click.option("--golden-dir", type=click.Path(file_okay=False, path_type=Path), default=GOLDEN, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def golden_add(finding: Path, status: str, as_json: bool, **entry: Any) -> None:
    """Promote FINDING (a finding folder or its case.json) into the golden corpus with a ledger entry.

    The case is run first on each --backend available here (not for a quarantine entry): one that
    passes it, or an unknown backend name, is refused (exit 2)."""
    from pa_oracle.fuzz.triage.golden import GoldenError, promote

    try:
        done = promote(finding, status="quarantine" if status.startswith("quarantine") else "tolerated",
                       **entry)  # name, reason, issue, backends, check, golden_dir
    except GoldenError as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"case": str(done.case_path), "tensors": str(done.tensors_path), "entry": done.entry,
                               "verdicts": done.verdicts}, indent=1))
    else:
        for backend, verdict in done.verdicts.items():
            click.echo(f"  {backend}: {verdict}", err=True)
        click.echo(f"added {done.case_path} (+ {done.tensors_path.name}) and a {done.entry['status']} entry in {done.ledger_path}")


@golden.command("report")
@click.argument("case_path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--backend", "-b", "backend_name", required=True, help="The adapter whose call the repro makes.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True, help="Report folder.")
@click.option("--gpu", default="NVIDIA H200", show_default=True, help="The GPU the finding was seen on.")
def golden_report(case_path: Path, backend_name: str, out_dir: Path, gpu: str) -> None:
    """Write OUT/repro.py and OUT/ISSUE.md for a golden case from what its ``meta.found_by`` recorded,
    without running the kernel. An existing ISSUE.md's hand-written ``## Why`` section and title are kept."""
    from pa_oracle.backends import discover
    from pa_oracle.fuzz.campaign.finding_record import read_finding
    from pa_oracle.fuzz.triage.upstream import HAND_WRITTEN, NoUpstreamRepro, seen_from_record, write_upstream

    try:
        finding = read_finding(case_path)
    except CaseError as exc:
        raise click.UsageError(str(exc)) from None
    known = discover()  # the kernel's library need not be installed here: the repro runs where it is
    if backend_name not in known:
        raise click.UsageError(f"unknown backend {backend_name!r}; known: {', '.join(sorted(known))}")
    backend = known[backend_name]()
    repro = out_dir / "repro.py"
    if repro.exists() and HAND_WRITTEN in repro.read_text():
        raise click.UsageError(f"{repro} was written by hand for the maintainers; not overwritten (move it away to regenerate)")
    issue = out_dir / "ISSUE.md"
    why = title = None
    if issue.exists() and "\n## Why\n" in issue.read_text():  # hand-written: keep its title and its Why
        text = issue.read_text()
        why, title = text.split("\n## Why\n", 1)[1], text.splitlines()[0].removeprefix("# ")
    try:
        written = write_upstream(out_dir, finding.case, backend, seen_from_record(finding.meta, gpu), explanation=why,
                                 title=title)
    except NoUpstreamRepro as exc:
        raise click.UsageError(str(exc)) from None
    click.echo("wrote " + ", ".join(str(p) for p in written.values()))
