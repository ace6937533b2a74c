"""``pa-oracle writes``: fuzz KV-cache write kernels (``pa_oracle.backends.writes``) against the
byte-for-byte write oracle, or replay a saved write case. Exit codes as every command
(``pa_oracle.fuzz.exits``): 0 no finding, 1 a finding, 2 bad input, 3 nothing could be judged."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pa_oracle.fuzz.exits import FINDING, NO_FINDING, TOOL_FAILED


@click.command()
@click.option("--backend", "-b", "names", multiple=True, help="Write kernel name (repeatable). Default: every available one.")
@click.option("--examples", "-n", type=click.IntRange(min=1), default=200, show_default=True, help="Examples per kernel.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True)
@click.option("--case", "case_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Replay one saved write case (writes.json) instead of fuzzing.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("pa-findings/writes"),
              show_default=True, help="Where failing cases are saved (never overwritten).")
def writes(names: tuple[str, ...], examples: int, seed: int, case_file: Path | None, out_dir: Path) -> None:
    """Append ragged batches into canary-filled paged pools and compare every byte: the appended
    slots must hold the appended values, everything else must be unchanged."""
    import random

    from hypothesis import HealthCheck, find, settings
    from hypothesis.errors import NoSuchExample

    from pa_oracle.backends.writes import discover
    from pa_oracle.fuzz.checks.append import judge_write
    from pa_oracle.fuzz.draw.appends import append_cases
    from pa_oracle.oracle.append import AppendCase
    from pa_oracle.oracle.case import CaseError, read_json

    registry = discover()
    if unknown := [n for n in names if n not in registry]:
        raise click.UsageError(f"unknown write kernel(s) {', '.join(unknown)} (known: {', '.join(sorted(registry))})")
    kernels = [registry[n]() for n in (names or sorted(registry))]
    usable = [k for k in kernels if not k.unavailable_reason()]
    for k in kernels:
        if k not in usable:
            click.echo(f"{k.name:28s} skipped: {k.unavailable_reason()}", err=True)
    if not usable:
        click.echo("pa-oracle: no write kernel could run here", err=True)
        click.get_current_context().exit(TOOL_FAILED)
    saved = read_json(case_file, CaseError) if case_file else None
    found = False
    for kernel in usable:
        if saved is not None:
            case = AppendCase.from_json(saved.get("case", saved) if isinstance(saved, dict) else saved)
            outcome = judge_write(case, kernel)
            click.echo(f"{kernel.name:28s} {outcome.status.upper()}: {outcome.detail}")
            found |= not outcome.ok
            continue
        tried = [0]

        def fails(case: AppendCase) -> bool:
            tried[0] += 1
            return not judge_write(case, kernel).ok

        try:
            case = find(append_cases(kernel.capabilities), fails,
                        settings=settings(max_examples=examples, database=None, deadline=None,
                                          suppress_health_check=list(HealthCheck)), random=random.Random(seed))
        except NoSuchExample:
            click.echo(f"{kernel.name:28s} ok   {tried[0]} examples")
            continue
        found = True
        outcome = judge_write(case, kernel)
        folder = _save(out_dir, kernel.name, case, outcome)
        click.echo(f"{kernel.name:28s} FAIL {outcome.status}: {outcome.detail}\n    saved {folder}; replay: "
                   f"pa-oracle writes -b {kernel.name} --case {folder / 'writes.json'}")
    click.get_current_context().exit(FINDING if found else NO_FINDING)


def _save(out_dir: Path, name: str, case, outcome) -> Path:  # type: ignore[no-untyped-def]
    import hashlib

    from pa_oracle.fuzz.campaign.outdir import publish_folder

    body = json.dumps({"kernel": name, "case": case.to_json(), "status": outcome.status, "detail": outcome.detail},
                      indent=1, sort_keys=True)
    digest = hashlib.sha256(json.dumps(case.to_json(), sort_keys=True).encode()).hexdigest()[:10]

    def write(tmp: Path, _final: Path) -> None:
        (tmp / "writes.json").write_text(body + "\n")

    return publish_folder(out_dir, f"{name}-{digest}", write)
