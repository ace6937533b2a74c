"""``pa-oracle writes``: fuzz KV-cache write kernels (``pa_oracle.backends.writes``: ``-b NAME``, a
``pa_oracle.backends.writes`` entry point, or ``--kernel MODULE:NAME``) against the byte-for-byte write
oracle in a write campaign (``pa_oracle.fuzz.campaign.writes``: isolation, budgets, resume), or replay a
saved write case. Exit codes as every command (``pa_oracle.fuzz.exits``): 0 no finding, 1 a finding,
2 bad input, 3 nothing could be judged or the run stopped early."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, Optional

import click
import msgspec

from pa_oracle.fuzz.exits import FINDING, NO_FINDING, campaign_exit_code, remember_out_dir
from pa_oracle.oracle.errors import BadInput

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
    dtype: Literal["bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2"] = "bfloat16"
    kv_layout: Literal["NHD", "HND"] = "NHD"
    combined: bool = False
    spare_pages: Annotated[int, msgspec.Meta(ge=0, le=1 << 16)] = 2
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0
    append_dtype: Optional[Literal["bfloat16", "float16", "float32"]] = None
    k_scale: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    v_scale: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    padding: Annotated[int, msgspec.Meta(ge=0, le=1 << 16)] = 0


class SavedWrite(msgspec.Struct, forbid_unknown_fields=True):
    """A ``writes.json`` that ``writes`` saved: the case, the kernel and what it did."""

    case: WriteCase
    kernel: Optional[str] = None
    status: Optional[str] = None
    detail: Optional[str] = None


@click.command()
@click.option("--backend", "-b", "names", multiple=True, help="Write kernel name (repeatable). Default: every available one.")
@click.option("--kernel", "kernels", multiple=True, metavar="MODULE:NAME",
              help="A write function or WriteKernel class of your own (repeatable; pa_oracle.backends.writes.user).")
@click.option("--examples", "-n", type=click.IntRange(min=1), default=200, show_default=True, help="Examples per kernel.")
@click.option("--time-budget", type=click.FloatRange(min=0, min_open=True, max=1e9), default=None,
              help="Seconds for the whole run, shared by the kernels.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True)
@click.option("--case", "case_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Replay one saved write case (writes.json) instead of fuzzing.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("pa-findings/writes"),
              show_default=True, help="Where failing cases and the campaign's state are saved (findings never overwritten).")
@click.option("--resume", is_flag=True, help="Continue the write campaign whose state is in --out.")
@click.option("--overwrite", is_flag=True, help="Start again although --out holds a write campaign's state.")
@click.option("--isolate/--no-isolate", default=None,
              help="Run cases in a restartable worker process (default: on for --kernel, library and CUDA kernels).")
@click.option("--case-timeout", type=click.FloatRange(min=0, min_open=True, max=86400), default=60.0, show_default=True,
              help="Seconds before an isolated case counts as a hang.")
def writes(names: tuple[str, ...], kernels: tuple[str, ...], examples: int, time_budget: float | None, seed: int,
           case_file: Path | None, out_dir: Path, resume: bool, overwrite: bool, isolate: bool | None,
           case_timeout: float) -> None:
    """Append ragged batches into canary-filled paged pools and compare every byte: the appended
    slots must hold the appended values (an fp8 cache: quantised once with the case's scale), padding
    rows (slot -1) nothing, and everything else must be unchanged."""
    from pa_oracle.backends.writes import resolve
    from pa_oracle.fuzz.campaign.writes import STATE_FILE, WriteCampaign, load_state, run_write_campaign

    ctx = click.get_current_context()
    chosen = [(k, ("kernel", k.name) if ":" in k.name and k.name in kernels else ("name", k.name))
              for k in resolve(names, kernels)]
    if not chosen:
        raise BadInput("no write kernel can run here (pa-oracle env lists what is missing)")
    config = WriteCampaign(examples=examples, seed=seed, time_budget=time_budget, case_timeout=case_timeout,
                           out_dir=out_dir, isolate=isolate)
    if case_file is not None:
        ctx.exit(_replay(chosen, read_write_case(case_file), config, isolate))
    out_dir = _out_for_this_run(ctx, out_dir, resume, overwrite)
    remember_out_dir(ctx, out_dir)
    state_file = out_dir / STATE_FILE
    config = WriteCampaign(**{**config.__dict__, "out_dir": out_dir})
    saved = load_state(state_file, config) if resume else None
    out_dir.mkdir(parents=True, exist_ok=True)
    results = run_write_campaign(chosen, config, state_file, resume=saved)
    for result in results:
        click.echo(result.line())
        for finding in result.findings:
            if finding["folder"]:
                click.echo(f"    saved {finding['folder']}; replay: {finding['repro']}")
    code, why = campaign_exit_code(results, may_be_empty=time_budget is not None)
    for line in why:
        click.echo(f"pa-oracle: {line}", err=True)
    ctx.exit(code)


def _out_for_this_run(ctx: click.Context, out_dir: Path, resume: bool, overwrite: bool) -> Path:
    """Where this run writes, as ``fuzz`` decides it: a given ``--out`` that holds a write campaign is refused
    without ``--resume`` or ``--overwrite``; the default one gets a fresh ``run-YYYYMMDD-HHMMSS`` folder in it."""
    import time

    from click.core import ParameterSource

    from pa_oracle.fuzz.campaign.outdir import OutDirConflict
    from pa_oracle.fuzz.campaign.writes import STATE_FILE

    if resume and overwrite:
        raise click.UsageError("--resume continues the write campaign in --out and --overwrite starts a new one: give one of them")
    state_file = out_dir / STATE_FILE
    if resume and not state_file.exists():
        raise BadInput(f"--resume: {state_file} does not exist (no write campaign to continue)")
    if not state_file.exists() or resume or overwrite:
        return out_dir
    if ctx.get_parameter_source("out_dir") == ParameterSource.COMMANDLINE:
        raise OutDirConflict(f"{out_dir} holds a write campaign ({STATE_FILE}): --resume continues it, --overwrite starts "
                             "a new one in its place (finding folders are kept), or give another --out")
    folder = out_dir / time.strftime("run-%Y%m%d-%H%M%S")
    for n in range(2, 1000):
        if not folder.exists():
            break
        folder = out_dir / (time.strftime("run-%Y%m%d-%H%M%S") + f"-{n}")
    click.echo(f"{out_dir} holds an earlier write campaign (kept): this run writes {folder}", err=True)
    return folder


def _replay(chosen: list, case, config, isolate: bool | None) -> int:  # type: ignore[no-untyped-def]
    """Judge the saved ``case`` with each kernel (isolated as a campaign runs it: a crash replays as a crash)."""
    from pa_oracle.fuzz.campaign.writes import WriteWorker, isolated_by_default
    from pa_oracle.fuzz.checks.append import judge_write

    found = False
    for kernel, spec in chosen:
        if isolated_by_default(kernel, spec) if isolate is None else isolate:
            worker = WriteWorker(spec, config.case_timeout)
            try:
                status, detail = worker.judge(case, None)
            finally:
                worker.close()
        else:
            outcome = judge_write(case, kernel)
            status, detail = outcome.status, outcome.detail
        click.echo(f"{kernel.name:28s} {status.upper()}: {detail}")
        found |= status != "pass"
    return FINDING if found else NO_FINDING


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
