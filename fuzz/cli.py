"""``pa-oracle``: fuzz kernels against the float64 oracle, replay saved cases, show the environment."""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import click

from backends import discover
from backends.base import Backend, get_backend
from backends.user import UserKernel
from fuzz.campaign import fuzz_backend
from fuzz.runner import check_case
from fuzz.strategies import Limits
from oracle.case import Case, CaseError
from oracle.report import format_report


def available_backends() -> tuple[list[Backend], dict[str, str]]:
    """(usable backends, {name: why not} for the rest)."""
    usable, missing = [], {}
    for name, cls in sorted(discover().items()):
        backend = cls()
        reason = backend.unavailable_reason()
        if reason:
            missing[name] = reason
        else:
            usable.append(backend)
    return usable, missing


_INT_FIELDS = ("max_group_size", "min_qo_len", "max_qo_len", "page_size_multiple")


def narrow(backend: Backend, only: tuple[str, ...]) -> Backend:
    """Apply ``--only FIELD=VALUES`` to a backend's capabilities (e.g. ``head_dims=64,128``,
    ``q_dtypes=bfloat16``, ``alibi=false``, ``kv_dtypes=`` for none). Narrows what is drawn; it
    never widens what the kernel declares."""
    import dataclasses

    caps = backend.capabilities
    fields = {f.name: f for f in dataclasses.fields(caps)}
    changes: dict[str, Any] = {}
    for item in only:
        name, sep, raw = item.partition("=")
        if not sep or name not in fields:
            raise click.UsageError(f"--only takes FIELD=VALUES with FIELD one of {sorted(fields)}; got {item!r}")
        current = getattr(caps, name)
        if name in _INT_FIELDS:
            changes[name] = int(raw)
        elif isinstance(current, bool):
            if raw.lower() not in ("true", "false"):
                raise click.UsageError(f"--only {name} takes true or false, got {raw!r}")
            if raw.lower() == "true" and not current:
                raise click.UsageError(f"--only {name}=true widens {backend.name}'s declared capabilities")
            changes[name] = raw.lower() == "true"
        else:
            values = tuple(int(v) if v.isdigit() else v for v in raw.split(",") if v)
            declared = current if current is not None else None
            if declared is not None and not set(values) <= set(declared):
                raise click.UsageError(f"--only {name}={raw} is outside {backend.name}'s declared {declared}")
            changes[name] = values
    backend.capabilities = caps.replace(**changes)  # type: ignore[misc]
    return backend


def _select(backend_names: tuple[str, ...], kernels: tuple[str, ...]) -> list[Backend]:
    try:
        chosen = [get_backend(n) for n in backend_names] + [UserKernel.from_spec(k) for k in kernels]
    except (KeyError, ValueError, ImportError) as exc:
        raise click.UsageError(str(exc).strip("'\"")) from None
    if not chosen:
        chosen, _ = available_backends()
    for backend in chosen:
        reason = backend.unavailable_reason()
        if reason:
            raise click.UsageError(f"backend {backend.name} is not available here: {reason}")
    return chosen


@click.group()
@click.version_option(package_name="paged-attention-oracle")
def main() -> None:
    """Differential testing of paged-attention kernels against a float64 oracle."""


@main.command()
@click.option("--backend", "-b", "backend_names", multiple=True, help="Backend name (repeatable). Default: every available one.")
@click.option("--kernel", "-k", "kernels", multiple=True, help="A user kernel as MODULE:FUNCTION (repeatable).")
@click.option("--examples", "-n", default=200, show_default=True, help="Examples per backend.")
@click.option("--seed", default=0, show_default=True, help="Base seed: the same seed draws the same cases.")
@click.option("--time-budget", type=float, default=None, help="Seconds for the whole run, shared by the backends.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("pa-findings"), show_default=True)
@click.option("--max-batch", default=Limits.max_batch, show_default=True)
@click.option("--max-kv-len", default=Limits.max_kv_len, show_default=True)
@click.option("--isolate/--no-isolate", default=None, help="Run cases in a restartable worker process (default: on for CUDA backends).")
@click.option("--case-timeout", type=float, default=300.0, show_default=True, help="Seconds before an isolated case counts as a hang.")
@click.option("--only", multiple=True, help="Narrow what is drawn: FIELD=VALUES of Capabilities, e.g. head_dims=64,128.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of text.")
def fuzz(
    backend_names: tuple[str, ...], kernels: tuple[str, ...], examples: int, seed: int, time_budget: float | None,
    out_dir: Path, max_batch: int, max_kv_len: int, isolate: bool | None, case_timeout: float,
    only: tuple[str, ...], as_json: bool,
) -> None:
    """Fuzz kernels against the oracle; exit 1 on any finding."""
    chosen = [narrow(b, only) for b in _select(backend_names, kernels)]
    limits = Limits(max_batch=max_batch, max_kv_len=max_kv_len)
    start = time.monotonic()
    results = []
    for i, backend in enumerate(chosen):
        deadline = None
        if time_budget is not None:
            deadline = start + time_budget * (i + 1) / len(chosen)
        click.echo(f"fuzzing {backend.name} on {backend.device} ...", err=True)
        spec = backend.name if isinstance(backend, UserKernel) else None
        isolated = backend.device == "cuda" if isolate is None else isolate
        result = fuzz_backend(
            backend, examples=examples, base_seed=seed, deadline=deadline, limits=limits, out_dir=out_dir,
            kernel_spec=spec, progress=lambda line: click.echo("  " + line, err=True),
            isolate_timeout=case_timeout if isolated else None,
        )
        results.append(result)
        if result.finding and not as_json:
            click.echo(f"\nFINDING in {backend.name}: {result.finding.message.splitlines()[0]}")
            click.echo(f"  minimal case: {result.finding.case.summary()}")
            click.echo(f"  report: {result.finding_dir / 'report.md'}")
            click.echo(f"  repro:  {result.repro}\n")
    if as_json:
        click.echo(json.dumps([_result_json(r) for r in results], indent=1))
    else:
        click.echo("\n".join(r.line() for r in results))
    if any(r.finding for r in results):
        sys.exit(1)


def _result_json(result: Any) -> dict[str, Any]:
    return {
        "backend": result.backend, "examples": result.examples, "passed": result.passed,
        "unsupported": result.unsupported, "seconds": round(result.seconds, 2), "worst_ratio": result.worst_ratio,
        "finding": None if not result.finding else {
            "status": result.finding.status, "message": result.finding.message.splitlines()[0],
            "dir": str(result.finding_dir), "repro": result.repro, "case": result.finding.case.summary(),
        },
        "notes": result.notes,
    }


@main.command()
@click.argument("case_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--backend", "-b", "backend_name", help="Backend to run (default: the one that found the case).")
@click.option("--kernel", "-k", help="A user kernel as MODULE:FUNCTION.")
@click.option("--json", "as_json", is_flag=True)
def replay(case_file: Path, backend_name: str | None, kernel: str | None, as_json: bool) -> None:
    """Re-run a saved case on one backend and print the verdict; exit 1 if it fails."""
    try:
        case = Case.load(case_file)
    except CaseError as exc:
        raise click.ClickException(str(exc)) from None
    if not backend_name and not kernel:
        kernel = case.meta.get("kernel")
        backend_name = None if kernel else case.meta.get("backend")
    if not backend_name and not kernel:
        raise click.UsageError("give --backend or --kernel (the case file names neither)")
    backend = _select((backend_name,) if backend_name else (), (kernel,) if kernel else ())[0]
    outcome = check_case(backend, case)
    if as_json:
        payload = {"backend": backend.name, "status": outcome.status, "message": outcome.message}
        click.echo(json.dumps(payload, indent=1))
    elif outcome.verdict is not None:
        click.echo(format_report(case, backend.name, outcome.verdict))
    else:
        click.echo(f"{backend.name}: {outcome.status.upper()}: {outcome.message}")
    if outcome.is_finding:
        sys.exit(1)


@main.command()
@click.option("--json", "as_json", is_flag=True)
def env(as_json: bool) -> None:
    """Versions, devices and which backends are available (and why not)."""
    import torch

    usable, missing = available_backends()
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "devices": ["cpu"] + [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "backends": {b.name: {"available": True, "device": b.device, "versions": b.versions()} for b in usable},
    }
    info["backends"].update({name: {"available": False, "why": why} for name, why in missing.items()})
    if as_json:
        click.echo(json.dumps(info, indent=1))
        return
    click.echo(f"python {info['python']}, torch {info['torch']}, cuda {info['cuda']}")
    click.echo("devices: " + ", ".join(info["devices"]))
    for name, entry in info["backends"].items():
        state = f"available on {entry['device']}" if entry["available"] else f"unavailable: {entry['why']}"
        click.echo(f"  {name:16s} {state}")


@main.command()
@click.option("--backend", "-b", "backend_names", multiple=True, help="Backend name (repeatable). Default: every available one.")
@click.option("--kernel", "-k", "kernels", multiple=True, help="A user kernel as MODULE:FUNCTION (repeatable).")
@click.option("--examples", "-n", default=30, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--only", multiple=True, help="Narrow what is drawn (as for fuzz).")
@click.option("--json", "as_json", is_flag=True)
def properties(backend_names: tuple[str, ...], kernels: tuple[str, ...], examples: int, seed: int, only: tuple[str, ...], as_json: bool) -> None:
    """Report determinism and batch invariance per kernel (properties, not failures)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed

    from fuzz.properties import measure
    from fuzz.strategies import cases

    report = {}
    for backend in [narrow(b, only) for b in _select(backend_names, kernels)]:
        counts = {"cases": 0, "deterministic": 0, "batched": 0, "batch_invariant": 0, "errors": 0}

        @settings(max_examples=examples, database=None, deadline=None, suppress_health_check=list(HealthCheck))
        @hypothesis_seed(seed)
        @given(cases(backend.capabilities))
        def run(case: Case) -> None:
            try:
                props = measure(backend, case)
            except Exception:  # noqa: BLE001 - correctness is fuzz's job; count and move on
                counts["errors"] += 1
                return
            counts["cases"] += 1
            counts["deterministic"] += props.deterministic
            if props.batch_invariant is not None:
                counts["batched"] += 1
                counts["batch_invariant"] += props.batch_invariant

        run()
        report[backend.name] = counts
        if not as_json:
            click.echo(
                f"{backend.name}: deterministic {counts['deterministic']}/{counts['cases']}, "
                f"batch-invariant {counts['batch_invariant']}/{counts['batched']} (errors {counts['errors']})"
            )
    if as_json:
        click.echo(json.dumps(report, indent=1))


@main.command()
@click.option("--backend", "-b", "backend_names", multiple=True, help="Backend name (repeatable). Default: every available one.")
@click.option("--kernel", "-k", "kernels", multiple=True, help="A user kernel as MODULE:FUNCTION (repeatable).")
@click.option("--check", "-c", "check_names", multiple=True,
              help="reorder, relabel, alone, merge, window, plan-reuse, stale-plan-pages, stale-plan-lengths, cuda-graph (repeatable). Default: all.")
@click.option("--examples", "-n", default=30, show_default=True, help="Examples per backend and check.")
@click.option("--seed", default=0, show_default=True)
@click.option("--only", multiple=True, help="Narrow what is drawn (as for fuzz).")
@click.option("--case", "case_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Run the checks on this case instead of drawing cases.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("pa-findings"), show_default=True)
@click.option("--json", "as_json", is_flag=True)
def metamorphic(
    backend_names: tuple[str, ...], kernels: tuple[str, ...], check_names: tuple[str, ...], examples: int, seed: int,
    only: tuple[str, ...], case_file: Path | None, out_dir: Path, as_json: bool,
) -> None:
    """Checks beyond output values: metamorphic relations (kernel vs kernel), plan reuse and stale
    plans, CUDA-graph replay. Exit 1 on any violation."""
    import difflib

    from fuzz.check_campaign import CHECKS, CheckResult, run_check, save_check_finding

    unknown = [name for name in check_names if name not in CHECKS]
    if unknown:
        close = difflib.get_close_matches(unknown[0], CHECKS, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise click.UsageError(f"unknown check {unknown[0]!r}{hint} (known: {', '.join(CHECKS)})")
    checks = [CHECKS[name] for name in check_names or CHECKS]
    try:
        case = Case.load(case_file) if case_file else None
    except CaseError as exc:
        raise click.ClickException(str(exc)) from None
    results: list[CheckResult] = []
    for backend in [narrow(b, only) for b in _select(backend_names, kernels)]:
        spec = backend.name if isinstance(backend, UserKernel) else None
        for check in checks:
            if case is None:
                result = run_check(backend, check, examples=examples, base_seed=seed, out_dir=out_dir, kernel_spec=spec)
            else:
                result = CheckResult(backend.name, check.name)
                outcome = check(backend, case)
                result.examples = 1
                result.holds, result.skipped = outcome.status == "holds", outcome.status == "skipped"
                result.exact = bool(outcome.exact) and outcome.status == "holds"
                if outcome.status == "skipped":
                    result.skip_reasons[outcome.message] += 1
                if outcome.is_finding:
                    result.finding = outcome
                    result.finding_dir, result.repro = save_check_finding(outcome, backend, out_dir, spec)
            results.append(result)
            if not as_json:
                click.echo(result.line())
                if result.finding:
                    click.echo(f"  report: {result.finding_dir / 'report.md'}\n  repro:  {result.repro}")
    if as_json:
        click.echo(json.dumps([{
            "backend": r.backend, "check": r.check, "examples": r.examples, "held": r.holds, "bit_exact": r.exact,
            "skipped": r.skipped, "not_applicable": r.not_applicable, "seconds": round(r.seconds, 2),
            "violation": None if not r.finding else {
                "status": r.finding.status, "message": r.finding.message.splitlines()[0],
                "dir": str(r.finding_dir), "repro": r.repro,
            },
        } for r in results], indent=1))
    if any(r.finding for r in results):
        sys.exit(1)


@main.command()
@click.option("--examples", "-n", default=200, show_default=True, help="Budget per planted bug.")
@click.option("--correct-examples", default=150, show_default=True, help="Examples per correct kernel.")
@click.option("--seed", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def selftest(examples: int, correct_examples: int, seed: int, as_json: bool) -> None:
    """Detection power: planted bugs found, correct kernels not flagged; exit 1 otherwise."""
    import dataclasses

    from fuzz.quality.selftest import run_selftest

    results = run_selftest(examples=examples, correct_examples=correct_examples, seed=seed,
                           progress=None if as_json else click.echo)
    bugs = [r for r in results if r.planted]
    correct = [r for r in results if not r.planted]
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    else:
        found = sum(r.detected for r in bugs)
        median = sorted(r.examples for r in bugs)[len(bugs) // 2]
        click.echo(
            f"detection {found}/{len(bugs)} planted bugs (median {median} examples to detection), "
            f"false alarms {sum(r.detected for r in correct)}/{len(correct)} correct kernels"
        )
    if not all(r.ok for r in results):
        sys.exit(1)


from gates.cli import gate  # noqa: E402  (the group imports nothing heavy)

main.add_command(gate)

from fuzz.triage.cli import golden, triage  # noqa: E402  (imports its heavy parts inside the commands)

main.add_command(triage)
main.add_command(golden)
