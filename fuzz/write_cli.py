"""``pa-oracle writes``: fuzz KV-cache write kernels (``pa_oracle.backends.writes``: ``-b NAME``, a
``pa_oracle.backends.writes`` entry point, or ``--kernel MODULE:NAME``) against the byte-for-byte write
oracle, or replay a saved write case. The campaign is the engine's (``pa_oracle.fuzz.campaign.engine``,
``run_campaign``) with the write check (``pa_oracle.fuzz.checks.append.WRITE``): the same chunks and seeds,
rejection of cases drawn before, budgets, isolation, ledger skips (``--ledger``), resume (the state in
``--out/writes-state.json``) and finding folders (``pa_oracle.fuzz.campaign.findings.publish_write_finding``).
An attention kernel's name is refused (exit 2: ``pa-oracle fuzz`` runs it). Exit codes as every command
(``pa_oracle.fuzz.exits``): 0 no finding, 1 a finding, 2 bad input, 3 nothing could be judged or the run
stopped early."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

import click
import msgspec

from pa_oracle.fuzz.exits import FINDING, NO_FINDING, campaign_exit_code, remember_out_dir
from pa_oracle.oracle.errors import BadInput

if TYPE_CHECKING:
    from pa_oracle.backends import Backend
    from pa_oracle.fuzz.campaign.state import BackendResult
    from pa_oracle.oracle.append import AppendCase

STATE_FILE = "writes-state.json"  # the write campaign's state in --out (the engine's ``CampaignState``)

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
    """A ``writes.json`` that ``writes`` saved: the case, the kernel, what it did and the finding record (``meta``,
    read by ``pa_oracle.fuzz.campaign.finding_record.read_meta``)."""

    case: WriteCase
    kernel: Optional[str] = None
    status: Optional[str] = None
    detail: Optional[str] = None
    meta: Optional[dict[str, Any]] = None


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
@click.option("--ledger", "ledger_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Skip drawn cases a ledger entry of the write check covers (its 'matches' over write-case fields).")
def writes(names: tuple[str, ...], kernels: tuple[str, ...], examples: int, time_budget: float | None, seed: int,
           case_file: Path | None, out_dir: Path, resume: bool, overwrite: bool, isolate: bool | None,
           case_timeout: float, ledger_file: Path | None) -> None:
    """Append ragged batches into canary-filled paged pools and compare every byte: the appended
    slots must hold the appended values (an fp8 cache: quantised once with the case's scale), padding
    rows (slot -1) nothing, and everything else must be unchanged."""
    from pa_oracle.backends import resolve
    from pa_oracle.fuzz.campaign.config import CampaignConfig
    from pa_oracle.fuzz.campaign.engine import run_campaign
    from pa_oracle.fuzz.campaign.ledger import load_ledger
    from pa_oracle.fuzz.checks.append import WRITE

    ctx = click.get_current_context()
    chosen = resolve(names, kernels, kind="write")
    if not chosen:
        raise BadInput("no write kernel can run here (pa-oracle env lists what is missing)")
    ledger = load_ledger(ledger_file) if ledger_file is not None else None
    config = CampaignConfig(examples=examples, seed=seed, checks=(WRITE,), isolate=isolate, case_timeout=case_timeout,
                            time_budget=time_budget, pipeline=False, ledger=ledger)
    if case_file is not None:
        ctx.exit(_replay(chosen, read_write_case(case_file), config))
    out_dir = _out_for_this_run(ctx, out_dir, resume, overwrite)
    remember_out_dir(ctx, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = _state(out_dir / STATE_FILE, seed, resume, chosen)
    results = run_campaign(chosen, state, out_dir / STATE_FILE, config.replace(out_dir=out_dir))
    for result in results:
        click.echo(result_line(result))
        for finding in result.findings:
            if finding.dir:
                click.echo(f"    saved {finding.dir}; replay: {finding.repro}")
    code, why = campaign_exit_code(results, may_be_empty=time_budget is not None)
    for line in why:
        click.echo(f"pa-oracle: {line}", err=True)
    ctx.exit(code)


def _state(path: Path, seed: int, resume: bool, chosen: list[Backend]) -> Any:
    """A new campaign state, or the one in ``path`` to continue with ``seed`` (another seed: bad input)."""
    from pa_oracle.fuzz.campaign.state import CampaignState

    if not resume:
        return CampaignState({"seed": seed, "kind": "writes", "backends": [b.name for b in chosen]})
    state = CampaignState.load(path)
    if state.config.get("seed") != seed:
        raise BadInput(f"{path}: config.seed is {state.config.get('seed')!r}, this run's --seed is {seed}: it cannot continue it")
    return state


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


def _out_for_this_run(ctx: click.Context, out_dir: Path, resume: bool, overwrite: bool) -> Path:
    """Where this run writes, as ``fuzz`` decides it: a given ``--out`` that holds a write campaign is refused
    without ``--resume`` or ``--overwrite``; the default one gets a fresh ``run-YYYYMMDD-HHMMSS`` folder in it."""
    import time

    from click.core import ParameterSource

    from pa_oracle.fuzz.campaign.outdir import OutDirConflict

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


def _replay(chosen: list[Backend], case: AppendCase, config: Any) -> int:
    """Judge the saved ``case`` with each kernel (isolated as a campaign runs it: a crash replays as a crash)."""
    found = False
    for backend in chosen:
        outcome = judge_saved_write(backend, case, config.isolate, config.case_timeout)
        status = "hang" if outcome.status == "crash" and outcome.message.startswith("hang:") else outcome.status
        click.echo(f"{backend.name:28s} {status.upper()}: {outcome.message}")
        found |= outcome.is_finding
    return FINDING if found else NO_FINDING


def judge_saved_write(backend: Backend, case: AppendCase, isolate: bool | None, timeout: float) -> Any:
    """The write check's ``Outcome`` for ``case`` on ``backend``, isolated as a campaign runs it
    (``pa_oracle.fuzz.run.judge.case_judge``; ``isolate`` None: the kernel's default)."""
    from pa_oracle.fuzz.checks.append import WRITE, engine_case
    from pa_oracle.fuzz.run.judge import case_judge

    with case_judge(backend, isolate=isolate, timeout=timeout, judge=WRITE) as judge:
        return judge(engine_case(case))


def read_write_case(path: Path) -> AppendCase:
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
        saved = convert(data, SavedWrite, where=str(path), error=CaseError)
        if saved.meta is not None:
            from pa_oracle.fuzz.campaign.finding_record import read_meta

            read_meta(saved.meta, path)  # the finding record, strictly (a FindingError names the file and field)
        fields = msgspec.structs.asdict(saved.case)
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


def write_finding_file(path: Path) -> Path | None:
    """A write finding's ``writes.json`` (``path`` itself, or the one in the folder ``path``), else None."""
    from pa_oracle.fuzz.campaign.findings import WRITE_FINDING

    path = Path(path)
    if path.is_dir():
        return path / WRITE_FINDING if (path / WRITE_FINDING).is_file() else None
    return path if path.name == WRITE_FINDING else None


def replay_write_finding(saved: Path, names: tuple[str, ...], kernels: tuple[str, ...]) -> tuple[str, int]:
    """``pa-oracle replay`` of a write finding: (the verdict's line, the exit code: 1 a finding, 3 no verdict, 0 a
    pass). The kernel is ``names``/``kernels``, else the registered one its record names (a user kernel named
    there is never imported: bad input asking for ``--kernel``)."""
    from pa_oracle.backends import resolve
    from pa_oracle.fuzz.campaign.finding_record import read_meta
    from pa_oracle.fuzz.run.isolation import default_case_timeout

    case = read_write_case(saved)
    if not names and not kernels:
        data = json.loads(saved.read_text())
        meta = read_meta(data.get("meta") or {}, saved)
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
