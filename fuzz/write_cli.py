"""``pa-oracle writes``: fuzz KV-cache write kernels (``pa_oracle.backends.writes``) against the
byte-for-byte write oracle, or replay a saved write case. Exit codes as every command
(``pa_oracle.fuzz.exits``): 0 no finding, 1 a finding, 2 bad input, 3 nothing could be judged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, Optional

import click
import msgspec

from pa_oracle.fuzz.exits import FINDING, NO_FINDING, TOOL_FAILED

# what a saved write case may ask for: a pool (K and V, float32 at most) beyond this is refused before
# anything is allocated; far above what `writes` draws (tens of pages) and what a test device holds
MAX_POOL_BYTES = 4 << 30
MAX_REQUESTS, MAX_TOKENS = 4096, 1 << 24


_Size = Annotated[int, msgspec.Meta(ge=1, le=1 << 16)]
_Length = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS)]
_Lengths = Annotated[list[_Length], msgspec.Meta(min_length=1, max_length=MAX_REQUESTS)]


class WriteCase(msgspec.Struct, forbid_unknown_fields=True):
    """A write case as a file holds it (``oracle.append.AppendCase``'s fields, strictly typed and bounded)."""

    seq_lens_before: _Lengths
    append_lens: _Lengths
    page_size: _Size
    num_kv_heads: _Size
    head_dim: _Size
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    kv_layout: Literal["NHD", "HND"] = "NHD"
    combined: bool = False
    spare_pages: Annotated[int, msgspec.Meta(ge=0, le=1 << 16)] = 2
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0


class SavedWrite(msgspec.Struct, forbid_unknown_fields=True):
    """A ``writes.json`` that ``writes`` saved: the case, the kernel and what it did."""

    case: WriteCase
    kernel: Optional[str] = None
    status: Optional[str] = None
    detail: Optional[str] = None


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
    saved = read_write_case(case_file) if case_file else None
    found = False
    for kernel in usable:
        if saved is not None:
            case = saved
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


def read_write_case(path: Path):  # type: ignore[no-untyped-def]
    """The write case in ``path`` (a saved ``writes.json``, or the case object alone), strictly: no float or
    bool for an int, no unknown field, bounded sizes, and a pool of at most ``MAX_POOL_BYTES``; anything else
    is a ``CaseError`` (exit 2) naming the file and the field, before a tensor is allocated."""
    from pa_oracle.oracle.append import AppendCase
    from pa_oracle.oracle.case import CaseError, read_json
    from pa_oracle.oracle.schema import convert

    data = read_json(path, CaseError)
    if not isinstance(data, dict):
        raise CaseError(f"{path}: expected a JSON object (a write case), got {type(data).__name__} {json.dumps(data)[:60]}")
    if isinstance(data, dict) and "case" in data:
        fields = msgspec.structs.asdict(convert(data, SavedWrite, where=str(path), error=CaseError).case)
    else:
        fields = msgspec.structs.asdict(convert(data, WriteCase, where=str(path), error=CaseError))
    try:
        case = AppendCase.from_json(fields)
    except CaseError as exc:
        raise CaseError(f"{path}: {exc}") from None
    element = 4 if case.dtype == "float32" else 2
    pool_bytes = 2 * case.num_pages * case.page_size * case.num_kv_heads * case.head_dim * element
    if pool_bytes > MAX_POOL_BYTES:
        raise CaseError(f"{path}: case: its K/V pool would take {pool_bytes / 2**30:.3g} GiB ({case.num_pages} pages x "
                        f"page_size {case.page_size} x num_kv_heads {case.num_kv_heads} x head_dim {case.head_dim} x "
                        f"{case.dtype}), more than the {MAX_POOL_BYTES >> 30} GiB a write case may use")
    return case
