"""``pa-oracle``: fuzz kernels against the float64 oracle, replay saved cases, show the environment."""

from __future__ import annotations

import difflib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource
from pa_oracle.fuzz.exits import TOOL_FAILED, campaign_exit_code, remember_out_dir
from pa_oracle.oracle.errors import BadInput

if TYPE_CHECKING:  # the commands import what they use: `pa-oracle --help` imports neither torch nor Hypothesis
    from pa_oracle.backends.base import Backend
    from pa_oracle.fuzz.campaign.state import BackendResult, CampaignState
    from pa_oracle.fuzz.campaign.shard import Shard


_INT_FIELDS = {"max_group_size": 1, "min_qo_len": 0, "max_qo_len": 1, "page_size_multiple": 1}  # FIELD: its least value
_MAY_BE_EMPTY = ("kv_dtypes",)  # `kv_dtypes=`: no KV dtype besides q's own; every other list needs a value


def _only_values(name: str, annotation: str, raw: str) -> tuple[Any, ...]:
    """The values of ``--only name=raw`` for a tuple field, each of the field's element type."""
    items = raw.split(",") if raw else []
    if not items and name not in _MAY_BE_EMPTY:
        raise click.UsageError(f"--only {name}= takes at least one value (e.g. {name}=VALUE[,VALUE...])")
    if "" in items:
        raise click.UsageError(f"--only {name}={raw}: an empty value in the list")
    if "tuple[bool" in annotation:
        if any(v.lower() not in ("true", "false") for v in items):
            raise click.UsageError(f"--only {name} takes true, false or true,false; got {raw!r}")
        return tuple(v.lower() == "true" for v in items)
    if "tuple[tuple[int, int]" in annotation:
        pairs = [v.split(":") for v in items]
        if any(len(p) != 2 or not all(x.isdigit() and int(x) > 0 for x in p) for p in pairs):
            raise click.UsageError(f"--only {name} takes QK:VO pairs of positive integers, e.g. {name}=576:512; got {raw!r}")
        return tuple((int(a), int(b)) for a, b in pairs)
    if "tuple[int" in annotation:
        if any(not (v.isdigit() and int(v) > 0) for v in items):
            raise click.UsageError(f"--only {name} takes positive integers, e.g. {name}=16,64; got {raw!r}")
        return tuple(int(v) for v in items)
    return tuple(items)


def narrow(backend: Backend, only: tuple[str, ...]) -> Backend:
    """Apply ``--only FIELD=VALUES`` to a backend's capabilities (e.g. ``head_dims=64,128``,
    ``q_dtypes=bfloat16``, ``alibi=false``, ``kv_dtypes=`` for none). Narrows what is drawn; it
    never widens what the kernel declares. A value of the wrong type, an empty list or a zero
    size is a usage error (exit 2) naming the option, never a campaign that cannot draw."""
    import dataclasses

    caps = backend.capabilities
    fields = {f.name: f for f in dataclasses.fields(caps)}
    changes: dict[str, Any] = {}
    for item in only:
        name, sep, raw = item.partition("=")
        if not sep or name not in fields:
            raise click.UsageError(f"--only takes FIELD=VALUES with FIELD one of {sorted(fields)}; got {item!r}")
        current, annotation = getattr(caps, name), str(fields[name].type)
        if name in _INT_FIELDS:
            least = _INT_FIELDS[name]
            if not raw.isdigit() or int(raw) < least:
                raise click.UsageError(f"--only {name} takes a non-negative integer" + (f" of at least {least}" if least else "")
                                       + f", got {raw!r}")
            changes[name] = int(raw)
        elif isinstance(current, bool):
            if raw.lower() not in ("true", "false"):
                raise click.UsageError(f"--only {name} takes true or false, got {raw!r}")
            if raw.lower() == "true" and not current:
                raise click.UsageError(f"--only {name}=true widens {backend.name}'s declared capabilities")
            changes[name] = raw.lower() == "true"
        elif not annotation.startswith("tuple"):
            raise click.UsageError(f"--only cannot narrow {name} (it is the kernel's convention, not a set of values)")
        else:
            values = _only_values(name, annotation, raw)
            if current is not None and not set(values) <= set(current):
                raise click.UsageError(f"--only {name}={raw} is outside {backend.name}'s declared {current}")
            changes[name] = values
    backend.capabilities = caps.replace(**changes)  # type: ignore[misc]
    if "devices" in changes and backend.device is None:  # else it would run on a device it was told not to use
        raise click.UsageError(f"--only devices={','.join(changes['devices'])}: {backend.name} {backend.unavailable_reason()}")
    return backend


def _select(backend_names: tuple[str, ...], kernels: tuple[str, ...], kind: str = "attention") -> list[Backend]:
    """The backends of ``kind`` the command line names (every usable one by default): a usage error for a name
    or kernel that cannot be used here, bad input for no write kernel at all."""
    from pa_oracle.backends import BackendSpecError, resolve

    try:
        chosen = resolve(backend_names, kernels, kind=kind)
    except BackendSpecError as exc:
        raise click.UsageError(str(exc)) from None
    if kind == "write" and not chosen:
        raise BadInput("no write kernel can run here (pa-oracle env lists what is missing)")
    return chosen


def known_checks() -> dict[str, Any]:
    """Every check ``--check`` names: the registry's (the oracle comparison and the checks beyond it) and the
    write check (``pa_oracle.fuzz.checks.append.WRITE``, for write kernels: it runs alone)."""
    from pa_oracle.fuzz.checks.append import WRITE, WRITE_CHECK
    from pa_oracle.fuzz.checks.registry import ALL_CHECKS

    return {**ALL_CHECKS, WRITE_CHECK: WRITE}


class Seconds(click.FloatRange):
    """A positive, finite number of seconds (FloatRange lets nan and inf through)."""

    name = "seconds"

    def __init__(self) -> None:
        super().__init__(min=0, min_open=True)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return seconds

    def _describe_range(self) -> str:
        return "x>0, finite"


EXAMPLES = click.IntRange(min=1)
MAX_BATCH, MAX_KV_LEN = 4096, 1 << 20  # bounds on --max-batch / --max-kv-len: far above what a campaign can run
# fuzz.draw.strategies.Limits' defaults, here so that `--help` does not import torch (tests/test_cli_lazy.py checks them)
DEFAULT_MAX_BATCH, DEFAULT_MAX_KV_LEN = 6, 300

# The commands are joined into `pa-oracle` by pa_oracle.cli (the composition root), lazily.

WRITE_CHECK_NAME = "write"  # pa_oracle.fuzz.checks.append.WRITE_CHECK, here so that `--help` does not import torch
WRITES_CAMPAIGN = "writes-state"  # the write check's state file (OUT/writes-state.json), as `pa-oracle writes` named it
# options of the attention draws and builds: a write campaign refuses them by name (`pa-oracle writes` has none)
NOT_FOR_WRITES = {"only": "--only", "max_batch": "--max-batch", "max_kv_len": "--max-kv-len", "compile_budget": "--compile-budget"}


@click.command()
@click.option("--backend", "-b", "backend_names", multiple=True, help="Backend name (repeatable). Default: every available one.")
@click.option("--kernel", "-k", "kernels", multiple=True, help="A user kernel as MODULE:FUNCTION (repeatable).")
@click.option("--examples", "-n", type=EXAMPLES, default=200, show_default=True, help="Examples per backend.")
@click.option("--seed", default=0, show_default=True, help="Base seed: the same seed draws the same cases.")
@click.option("--time-budget", type=Seconds(), default=None, help="Seconds for the whole run, shared by the backends.")
@click.option("--compile-budget", type=Seconds(), default=None,
              help="Seconds of kernel compiles the run may spend (default 30% of --time-budget): cases are drawn inside a few built variants, rotating with --seed.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("pa-findings"), show_default=True)
@click.option("--max-batch", type=click.IntRange(1, MAX_BATCH), default=DEFAULT_MAX_BATCH, show_default=True)
@click.option("--max-kv-len", type=click.IntRange(1, MAX_KV_LEN), default=DEFAULT_MAX_KV_LEN, show_default=True)
@click.option("--isolate/--no-isolate", default=None, help="Run cases in a restartable worker process (default: on for user kernels, native kernel libraries and CUDA).")
@click.option("--case-timeout", type=Seconds(), default=300.0, show_default=True, help="Seconds before an isolated case counts as a hang (3x for the first case after a worker start).")
@click.option("--only", multiple=True, help="Narrow what is drawn: FIELD=VALUES of Capabilities, e.g. head_dims=64,128.")
@click.option("--resume", is_flag=True, help="Continue the campaign kept in --out at its next chunk (after a kill, or for a larger --examples).")
@click.option("--overwrite", is_flag=True,
              help="Start a new campaign in an --out that holds one (its state is replaced; finding folders and other files are kept).")
@click.option("--rerun-findings", is_flag=True, help="With --resume: fuzz again the backends that stopped at a finding.")
@click.option("--skip-known/--no-skip-known", default=True, show_default=True, help="Skip drawn cases that a ledger entry's 'matches' predicate covers.")
@click.option("--ledger", "ledger_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None, help="Known-failure ledger (default: golden/ledger.json).")
@click.option("--workers", type=click.IntRange(1, 4096), default=1, show_default=True, help="Worker processes, one shard each, pinned to the GPUs round-robin.")
@click.option("--shard", "shard_text", default=None, help="Run only shard I/N of the campaign (a job-array task); state in OUT/shards/.")
@click.option("--merge", "merge_only", is_flag=True, help="Fuzz nothing: merge the shard states in --out and print the summary.")
@click.option("--check", "-c", "check_names", multiple=True,
              help="The check to run (repeatable): oracle (the comparison with the float64 oracle), one of "
                   "`pa-oracle metamorphic --help`'s, or write (write kernels, alone: `pa-oracle writes`). Default: oracle.")
@click.option("--case", "case_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Run the checks on this saved case instead of drawing cases.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of text.")
@click.pass_context
def fuzz(ctx: click.Context, **options: Any) -> None:
    """Fuzz kernels against the oracle; exit 1 on any finding.

    The campaign's state is kept in --out (campaign.json, rewritten after a chunk of 25 examples
    about every second), so --resume continues it after a kill. One campaign at a time per --out (a lock
    file); a campaign never replaces or deletes a finding folder. --workers N runs N shards side
    by side and merges them; --shard I/N runs one shard (a job-array task), --merge merges their
    states. --check runs other checks in the same engine (their state: checks.json; the write check's,
    `pa-oracle writes`, writes-state.json)."""
    run_fuzz(ctx, FuzzOptions(**options))


@dataclass(frozen=True)
class FuzzOptions:
    """What ``fuzz`` (and ``metamorphic`` and ``writes``, its other defaults) was asked, as the command line gave it."""

    backend_names: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    check_names: tuple[str, ...] = ()
    case_file: Path | None = None
    examples: int = 200
    seed: int = 0
    time_budget: float | None = None
    compile_budget: float | None = None
    out_dir: Path = Path("pa-findings")
    max_batch: int = DEFAULT_MAX_BATCH
    max_kv_len: int = DEFAULT_MAX_KV_LEN
    isolate: bool | None = None
    case_timeout: float = 300.0
    only: tuple[str, ...] = ()
    resume: bool = False
    overwrite: bool = False
    rerun_findings: bool = False
    skip_known: bool = True
    ledger_file: Path | None = None
    workers: int = 1
    shard_text: str | None = None
    merge_only: bool = False
    as_json: bool = False
    command: str = "fuzz"  # the command that was run (its name in the line that says how to continue)

    @property
    def checks(self) -> tuple[str, ...]:
        return self.check_names or ("oracle",)

    @property
    def writes(self) -> bool:
        """Whether the run is the write check's (write kernels, ``pa-oracle writes``)."""
        return WRITE_CHECK_NAME in self.checks

    @property
    def kind(self) -> str:
        """The campaign's state file: campaign.json for the oracle comparison alone, writes-state.json for the
        write check, checks.json otherwise."""
        from pa_oracle.fuzz.campaign.state import CAMPAIGN, CHECKS_CAMPAIGN

        if self.writes:
            return WRITES_CAMPAIGN
        return CAMPAIGN if self.checks == ("oracle",) and self.command == "fuzz" else CHECKS_CAMPAIGN

    def refuse_conflicts(self) -> None:
        """Options that cannot go together: a usage error (exit 2) before anything runs."""
        from pa_oracle.fuzz.campaign.state import CAMPAIGN

        checks = known_checks()
        if unknown := [name for name in self.checks if name not in checks]:
            close = difflib.get_close_matches(unknown[0], checks, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise click.UsageError(f"unknown check {unknown[0]!r}{hint} (known: {', '.join(checks)})")
        if self.writes and len(self.checks) > 1:
            raise click.UsageError("--check write judges write kernels, the other checks attention kernels: "
                                   "run it alone (pa-oracle writes)")
        if self.resume and self.overwrite:
            raise click.UsageError("--resume continues the campaign in --out and --overwrite starts a new one: give one of them")
        if self.workers > 1 and self.shard_text:
            raise click.UsageError("--workers runs every shard itself; give --shard only without --workers")
        if self.workers > 1 and self.kind not in (CAMPAIGN, WRITES_CAMPAIGN):
            raise click.UsageError("--workers runs the oracle comparison or the write check only; run other checks with --shard I/N")
        if self.case_file and (self.resume or self.merge_only or self.shard_text or self.workers > 1):
            raise click.UsageError("--case runs one saved case: it takes no --resume, --shard, --merge or --workers")


def run_fuzz(ctx: click.Context, opts: FuzzOptions) -> None:
    """Run the campaign (or the one case) ``opts`` asks for, print its results and exit with their code."""
    from pa_oracle.fuzz.campaign.outdir import campaign_lock

    opts.refuse_conflicts()
    _refuse_what_writes_ignore(ctx, opts)
    shard = _parse_shard(opts.shard_text)
    chosen: list[Backend] = []
    if not opts.resume and not opts.merge_only:  # refuse bad backends and --only before anything is written under --out
        chosen = _select(opts.backend_names, opts.kernels, kind="write") if opts.writes else [
            narrow(b, opts.only) for b in _select(opts.backend_names, opts.kernels)]
    if opts.writes and opts.case_file is not None:  # a saved write case, judged on each kernel: nothing is written
        ctx.exit(_judge_the_write_case(opts, chosen))
    fresh = not (opts.resume or opts.overwrite or opts.merge_only or opts.shard_text or opts.case_file)
    out_dir = _default_out_for_a_new_run(ctx, opts.out_dir, opts.workers, opts.kind) if fresh else opts.out_dir
    remember_out_dir(ctx, out_dir)
    started, worker_codes, left_out = time.monotonic(), list[int](), dict[str, str]()
    with campaign_lock(out_dir, shard):  # the --workers parent holds --out, each worker its shard
        if opts.case_file is not None:
            results = _judge_the_case(opts, chosen, out_dir)
        elif opts.merge_only:
            results = _merged(out_dir, opts.kind)
        elif opts.workers > 1:
            results, worker_codes = _fuzz_with_workers(ctx, opts, out_dir)
        else:
            results, left_out = _fuzz_one_shard(ctx, opts, chosen, out_dir, shard)
        if opts.kind == "campaign" and opts.case_file is None:
            write_summary(out_dir, results)
    _print_results(opts, results, left_out, time.monotonic() - started)
    out_of_time = opts.time_budget is not None and time.monotonic() - started >= opts.time_budget
    may_be_empty = opts.merge_only or out_of_time or (opts.workers == 1 and shard.share(opts.examples) == 0)
    code, problems = campaign_exit_code(results, may_be_empty=may_be_empty, worker_codes=worker_codes)
    kept = "; the states are kept (--resume continues them)" if worker_codes and code == TOOL_FAILED else ""
    for line in problems:
        click.echo(f"pa-oracle: {line}{kept}", err=True)
    if opts.case_file is None:
        _name_the_folder(out_dir, to_stderr=opts.as_json, command=_continue_command(opts))
    ctx.exit(code)


def _refuse_what_writes_ignore(ctx: click.Context, opts: FuzzOptions) -> None:
    """A write campaign given an option of the attention draws or builds (``NOT_FOR_WRITES``): a usage error
    naming it (exit 2), never an option silently ignored."""
    given = [flag for name, flag in NOT_FOR_WRITES.items() if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE]
    if opts.writes and given:
        raise click.UsageError(f"{', '.join(given)}: not for write kernels (the write check draws write cases from each "
                               "kernel's WriteCapabilities; there is nothing to narrow, bound or build)")


def _judge_the_write_case(opts: FuzzOptions, chosen: list[Backend]) -> int:
    """``--case`` of the write check: the saved write case on each kernel, isolated as a campaign runs it (a crash
    replays as a crash), a line each (``NAME STATUS: DETAIL``); its exit code: 1 a finding, 3 no verdict, else 0."""
    from pa_oracle.fuzz.exits import FINDING, NO_FINDING
    from pa_oracle.fuzz.campaign.write_files import read_write_case
    from pa_oracle.fuzz.write_cli import judge_saved_write

    assert opts.case_file is not None
    case = read_write_case(opts.case_file)  # a CaseError (file and field) exits 2
    outcomes = [judge_saved_write(backend, case, opts.isolate, opts.case_timeout) for backend in chosen]
    rows = [{"backend": o.backend, "message": o.message,
             "status": "hang" if o.status == "crash" and o.message.startswith("hang:") else o.status} for o in outcomes]
    if opts.as_json:
        click.echo(json.dumps(rows, indent=1))
    for row in rows if not opts.as_json else []:
        click.echo(f"{row['backend']:28s} {row['status'].upper()}: {row['message']}")
    if any(o.status in ("error", "unsupported") for o in outcomes):
        return TOOL_FAILED  # no verdict: the tool could not judge, or the kernel declined the case
    return FINDING if any(o.is_finding for o in outcomes) else NO_FINDING


def _continue_command(opts: FuzzOptions) -> str:
    """The command that continues this campaign with --resume: ``fuzz`` with its checks, ``metamorphic`` or ``writes``."""
    if opts.command != "fuzz" or opts.checks == ("oracle",):
        return opts.command
    return "fuzz " + " ".join(f"-c {name}" for name in opts.checks)


def _merged(out_dir: Path, kind: str) -> list[BackendResult]:
    from pa_oracle.fuzz.campaign.state import load_shards, merge_results, missing_shards

    states = load_shards(out_dir, kind)
    if missing_shards(states):
        click.echo(f"no state yet for shards {', '.join(missing_shards(states))}: merging the others", err=True)
    return merge_results([list(s.results.values()) for s in states])


def _judge_the_case(opts: FuzzOptions, chosen: list[Backend], out_dir: Path) -> list[BackendResult]:
    """``--case``: every check on the one saved case, isolated as a campaign runs it; a finding saved as one."""
    from pa_oracle.fuzz.campaign.engine import CampaignConfig, judge_one
    from pa_oracle.fuzz.checks.registry import ALL_CHECKS
    from pa_oracle.oracle.tensors import load_case

    assert opts.case_file is not None
    case = load_case(opts.case_file)  # a CaseError exits 2 (pa_oracle.fuzz.exits)
    config = CampaignConfig(out_dir=out_dir, isolate=opts.isolate, case_timeout=opts.case_timeout)
    return [judge_one(backend, ALL_CHECKS[name], case, config) for backend in chosen for name in opts.checks]


def _fuzz_one_shard(ctx: click.Context, opts: FuzzOptions, chosen: list[Backend], out_dir: Path,
                    shard: Shard) -> tuple[list[BackendResult], dict[str, str]]:
    """This process's shard of the campaign (new or resumed): (its results, the backends its compile plan left out)."""
    from pa_oracle.fuzz.campaign.engine import CampaignConfig, run_campaign
    from pa_oracle.fuzz.campaign.ledger import GOLDEN, load_ledger
    from pa_oracle.fuzz.campaign.state import CAMPAIGN, state_path
    from pa_oracle.fuzz.campaign.variants import compile_budget as campaign_compile_budget
    from pa_oracle.fuzz.draw.strategies import Limits
    from pa_oracle.fuzz.progress import CampaignProgress

    oracle_only = opts.kind == CAMPAIGN
    path = state_path(out_dir, shard, opts.kind)
    ledger = load_ledger(opts.ledger_file or GOLDEN / "ledger.json") if opts.skip_known else None
    budget = campaign_compile_budget(opts.time_budget, opts.compile_budget) if oracle_only else None
    plan, explicit = None, bool(opts.backend_names or opts.kernels)
    limits = Limits(max_batch=opts.max_batch, max_kv_len=opts.max_kv_len)
    if not opts.resume:  # a named backend the budget cannot build is refused before anything is written
        plan = _compile_plan(chosen, limits, ledger, budget, opts.seed + shard.index, explicit=explicit)
    asked: dict[str, Any] = {"seed": opts.seed, "max_batch": opts.max_batch, "max_kv_len": opts.max_kv_len,
                             "only": list(opts.only), "backends": list(opts.backend_names), "kernels": list(opts.kernels),
                             "shard": str(shard)}
    if opts.writes:  # the attention draws' bounds and narrowing mean nothing to a write campaign
        del asked["max_batch"], asked["max_kv_len"], asked["only"]
    if not oracle_only:
        asked["checks"] = list(opts.checks)
    state, chosen = _start_or_resume(ctx, out_dir, path, asked, chosen if not opts.resume else [], resume=opts.resume,
                                     overwrite=opts.overwrite, workers=opts.workers, kind=opts.kind)
    saved = state.config
    limits = Limits(max_batch=saved.get("max_batch", opts.max_batch), max_kv_len=saved.get("max_kv_len", opts.max_kv_len))
    if opts.resume:
        plan = _compile_plan(chosen, limits, ledger, budget, int(saved.get("seed", 0)) + shard.index, explicit=False)
    if plan is not None and plan.left_out:
        chosen = [b for b in chosen if b.name not in plan.left_out]
    config = CampaignConfig(
        examples=opts.examples, time_budget=opts.time_budget, shard=shard, limits=limits, ledger=ledger,
        rerun_findings=opts.rerun_findings, isolate=opts.isolate, case_timeout=opts.case_timeout, out_dir=out_dir,
        checks=tuple(known_checks()[n] for n in saved.get("checks", opts.checks)), pipeline=not opts.writes,
    )
    if not oracle_only:
        return run_campaign(chosen, state, path, config, progress=lambda line: click.echo(line, err=True)), {}
    display = CampaignProgress(shard.share(opts.examples), write=lambda line: click.echo(line, err=True))
    ctx.call_on_close(display.close)  # a live display on a terminal, else a heartbeat: stopped on any exit
    results = run_campaign(chosen, state, path, config, progress=display.line, on_case=display.case, compile_plan=plan)
    display.close()
    return results, plan.left_out if plan is not None else {}


def write_summary(out_dir: Path, results: list[BackendResult]) -> None:
    """``summary.json`` in ``out_dir``: the results as ``--json`` prints them."""
    from pa_oracle.fuzz.campaign.state import write_atomically

    summary = [_result_json(r) for r in results]
    write_atomically(Path(out_dir) / "summary.json", json.dumps(summary, indent=1) + "\n")


def _print_results(opts: FuzzOptions, results: list[BackendResult], left_out: dict[str, str], wall: float) -> None:
    """The run's results on stdout: JSON, or each finding, each pair's line, the time line and the coverage table."""
    from pa_oracle.fuzz.campaign.coverage import coverage_table
    from pa_oracle.fuzz.campaign.findings import allowed_clause

    if opts.as_json:
        rows = [_result_json(r) if opts.kind == "campaign" else _check_result_json(r) for r in results]
        click.echo(json.dumps(rows, indent=1))
        return
    if opts.writes:  # a write kernel's line and its saved finding (pa_oracle.fuzz.write_cli.result_line)
        from pa_oracle.fuzz.write_cli import result_lines

        click.echo("\n".join(result_lines(results)))
    for r in results if not opts.writes else []:
        for f in r.findings:
            click.echo(f"\nFINDING in {r.key}{allowed_clause([f.message])}: {f.message}\n  minimal case: {f.case}")
            click.echo(f"  report: {Path(f.dir) / 'report.md' if f.dir else '(not saved)'}\n  repro:  {f.repro}\n")
    if not opts.writes:
        click.echo("\n".join(r.line() for r in results))
    for name, why in left_out.items():
        click.echo(f"{name}: LEFT OUT ({why})")
    if not opts.merge_only and opts.workers == 1 and opts.case_file is None:
        click.echo(time_line(results, wall))
    oracle = [(r.backend, r.coverage, r.declared) for r in results if r.check == "oracle"]
    if oracle and opts.case_file is None:
        click.echo("\n".join(coverage_table(oracle)))


def time_line(results: list[BackendResult], wall: float) -> str:
    """Where the run's ``wall`` seconds went: the backends' turns split into start / compile / judge, and the rest
    (loading backends, planning, waiting on builds between turns, saving); the parts add up to ``wall``."""
    parts = [sum(getattr(r, f) for r in results) for f in ("start_seconds", "compile_seconds", "judge_seconds")]
    other = max(wall - sum(parts), 0.0)
    return (f"time: {wall:.1f}s in all = start {parts[0]:.1f}s + compile {parts[1]:.1f}s + judge {parts[2]:.1f}s "
            f"(the backends' turns) + other {other:.1f}s (loading, planning, waiting for builds, saving)")


RUN_FOLDER = "run-%Y%m%d-%H%M%S"  # under the default --out, one per run once it holds a campaign


def _default_out_for_a_new_run(ctx: click.Context, out_dir: Path, workers: int, kind: str = "campaign") -> Path:
    """Where a new campaign goes. The user who gave --out gets it (and the refusal, if it holds a campaign:
    replacing a campaign is theirs to ask for, with --overwrite). With the default --out, the README's
    command run again means "fuzz again", not "replace" or "continue": the run gets a fresh
    ``pa-findings/run-YYYYMMDD-HHMMSS`` folder beside what is kept (nothing is moved or deleted); the
    first run, and every --shard/--merge/--resume, keeps ``pa-findings`` itself, where job arrays and the
    pytest plugin (``--pa-out``) look."""
    from pa_oracle.fuzz.campaign.outdir import kept_campaign
    from pa_oracle.fuzz.campaign.shard import Shard
    from pa_oracle.fuzz.campaign.state import state_path

    if ctx.get_parameter_source("out_dir") == ParameterSource.COMMANDLINE or not kept_campaign(
            out_dir, state_path(out_dir, Shard()), workers, kind):
        return out_dir
    stamp = time.strftime(RUN_FOLDER)
    for n in range(1, 1000):
        folder = out_dir / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            folder.mkdir(parents=True)
        except FileExistsError:  # another run started this second
            continue
        click.echo(f"{out_dir} holds an earlier campaign (kept): this run writes {folder}", err=True)
        ctx.meta["pa_oracle.fresh_out"] = folder  # --workers forwards it to its shards
        return folder
    raise click.UsageError(f"{out_dir}: no free run folder for {stamp}; give --out")


def _name_the_folder(out_dir: Path, *, to_stderr: bool, command: str = "fuzz") -> None:
    """The last line of every run (findings or none): the folder it wrote, and how to continue it."""
    if Path(out_dir).is_dir():
        click.echo(f"campaign folder: {out_dir} (continue it: pa-oracle {command} --resume --out {out_dir})", err=to_stderr)


def _compile_plan(backends: list[Backend], limits: Any, ledger: Any, budget: float | None, seed: int, *,
                  explicit: bool) -> Any:
    """The run's compile plan (None without a compile budget). A backend the user named whose variants cannot
    be built within the budget is bad input (exit 2, before anything runs); the default job leaves it out."""
    from pa_oracle.fuzz.campaign.compile_plan import CompilePlan
    from pa_oracle.fuzz.campaign.engine import known_findings

    if budget is None:
        return None
    known = (lambda b: known_findings(ledger, b)) if ledger else None
    plan = CompilePlan.make(backends, limits, budget=budget, seed=seed, known=known)
    if explicit and plan.left_out:
        raise BadInput("; ".join(f"{name}: {why}" for name, why in plan.left_out.items()))
    return plan


def _start_or_resume(ctx: click.Context, out_dir: Path, path: Path, asked: dict[str, Any], chosen: list[Backend], *,
                     resume: bool, overwrite: bool, workers: int = 1, kind: str = "campaign") -> tuple[CampaignState, list[Backend]]:
    """The campaign state at ``path`` and the backends it runs: with ``resume`` the saved state, its
    backends selected again from its config; else a new state for ``chosen``, refusing to replace a
    campaign kept under ``out_dir`` unless ``overwrite``. The config records the backends either way."""
    from pa_oracle.backends.user import UserKernel
    from pa_oracle.fuzz.campaign.outdir import kept_campaign, refuse_replacing
    from pa_oracle.fuzz.campaign.state import CampaignState

    if not resume:
        refuse_replacing([] if overwrite else kept_campaign(out_dir, path, workers, kind), out_dir)
    state = _resumed(ctx, path, asked, kind) if resume else CampaignState(asked)
    config = state.config
    if resume and kind == WRITES_CAMPAIGN:
        chosen = _select(tuple(config.get("backends", ())), tuple(config.get("kernels", ())), kind="write")
    elif resume:
        chosen = [narrow(b, tuple(config["only"])) for b in _select(tuple(config["backends"]), tuple(config["kernels"]))]
    users = [isinstance(b, UserKernel) or getattr(b, "user", False) is True for b in chosen]  # (a write kernel's: .user)
    config["backends"] = [b.name for b, user in zip(chosen, users) if not user]
    config["kernels"] = [b.name for b, user in zip(chosen, users) if user]
    return state, chosen


def _parse_shard(text: str | None) -> Shard:
    from pa_oracle.fuzz.campaign.shard import Shard

    try:
        return Shard.parse(text) if text else Shard()
    except ValueError as exc:
        raise click.UsageError(f"--shard: {exc}") from None


_CONFIG_OPTIONS = {"seed": "seed", "max_batch": "max_batch", "max_kv_len": "max_kv_len", "only": "only",
                   "backend_names": "backends", "kernels": "kernels", "shard_text": "shard", "check_names": "checks"}


def _resumed(ctx: click.Context, path: Path, asked: dict[str, Any], kind: str) -> CampaignState:
    """The state at ``path`` (its checks those of a campaign of ``kind``); an option given on the command line
    must agree with how it was started."""
    from pa_oracle.fuzz.campaign.state import CampaignState, resumed_checks

    state = CampaignState.load(path)
    resumed_checks(state, path, kind)
    for option, key in _CONFIG_OPTIONS.items():
        if key in asked and ctx.get_parameter_source(option) == ParameterSource.COMMANDLINE and asked[key] != state.config.get(key):
            raise click.UsageError(
                f"--resume: the campaign in {path} was started with {key}={state.config.get(key)!r}, "
                f"not {asked[key]!r} (its config.{key}); drop the option or start a new --out"
            )
    return state


def _fuzz_with_workers(ctx: click.Context, opts: FuzzOptions, out_dir: Path) -> tuple[list[BackendResult], list[int]]:
    """Run shards 0..workers-1 as worker processes (``pa-oracle fuzz --shard I/N``, the oracle comparison's or the
    write check's campaign); (merged results, the workers' exit codes)."""
    from pa_oracle.fuzz.campaign.outdir import kept_campaign, refuse_replacing
    from pa_oracle.fuzz.campaign.shard import Shard
    from pa_oracle.fuzz.campaign.state import CampaignStateError, load_shards, merge_results, missing_shards, state_path
    from pa_oracle.fuzz.campaign.drawers import ENV as DRAW_ENV
    from pa_oracle.fuzz.campaign.drawers import draw_processes
    from pa_oracle.fuzz.run.pool import ENV as WORKER_ENV
    from pa_oracle.fuzz.run.pool import worker_processes
    from pa_oracle.fuzz.run.workers import run_workers, visible_gpus

    workers, kind = opts.workers, opts.kind
    kept = kept_campaign(out_dir, state_path(out_dir, Shard(), kind), workers, kind)
    if not opts.resume:
        refuse_replacing([] if opts.overwrite else kept, out_dir)
        for stale in kept:  # --overwrite: the shard states are replaced (finding folders are kept)
            stale.unlink()
    gpus = visible_gpus()
    click.echo(f"{workers} workers on " + (f"GPUs {', '.join(gpus)} (round-robin)" if gpus else "CPU"), err=True)
    # the shards share the host: each draws ahead, and judges on a GPU, with its share of the cores (unless
    # PA_ORACLE_DRAW_PROCESSES or PA_ORACLE_WORKER_PROCESSES says)
    cores = (os.cpu_count() or 1) // workers
    share = {DRAW_ENV: str(draw_processes(cores=cores))}
    if gpus:
        share[WORKER_ENV] = str(worker_processes("cuda", cores=cores))
    codes = run_workers(_forwarded_args(ctx, opts), workers, gpus, extra_env=share)
    try:
        states = load_shards(out_dir, kind)
    except CampaignStateError:
        if all(c not in (0, 1) for c in codes):
            return [], codes  # no worker got as far as a state: their codes say why
        raise
    for shard in missing_shards(states):
        click.echo(f"pa-oracle: shard {shard} wrote no state", err=True)
    return merge_results([list(s.results.values()) for s in states]), codes


def _forwarded_args(ctx: click.Context, opts: FuzzOptions) -> list[str]:
    """The options given on this command line, as arguments for a worker, a ``pa-oracle fuzz`` (less
    --workers/--json). Another command's worker (``writes``) is also told its checks and each default of its
    own that is not ``fuzz``'s (``writes``' --out and --case-timeout)."""
    args: list[str] = []
    if fresh := ctx.meta.get("pa_oracle.fresh_out"):  # the run folder chosen under the default --out
        args += ["--out", str(fresh)]
    other = ctx.command is not fuzz
    if other and ctx.get_parameter_source("check_names") != ParameterSource.COMMANDLINE:
        args += [a for name in opts.checks for a in ("--check", name)]
    defaults = {p.name: p.default for p in fuzz.params}
    for param in ctx.command.params:
        name = param.name or ""
        given = ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE
        own_default = other and name in defaults and param.default != defaults[name] and not (name == "out_dir" and fresh)
        if name in ("workers", "as_json", "merge_only") or not (given or own_default):
            continue
        value, flag = ctx.params[name], max(param.opts, key=len)
        if isinstance(param, click.Option) and param.is_flag:
            args += [flag] if value else list(param.secondary_opts[:1])
        else:
            args += [a for v in (value if param.multiple else (value,)) for a in (flag, str(v))]
    return args


def _result_json(result: BackendResult) -> dict[str, Any]:
    findings = [vars(f) for f in result.findings]
    return {
        "backend": result.backend, "status": result.status, "examples": result.examples, "passed": result.passed,
        "unsupported": result.unsupported, "skipped_known": result.skipped_known, "chunks": result.chunks_done,
        "seconds": round(result.seconds, 2), "start_seconds": round(result.start_seconds, 2),
        "compile_seconds": round(result.compile_seconds, 2), "judge_seconds": round(result.judge_seconds, 2),
        "worst_ratio": result.worst_ratio, "worst_allowed": result.worst_allowed, "no_keys": result.no_keys, "coverage": result.coverage.to_json(result.declared),
        "finding": findings[0] if findings else None, "findings": findings, "notes": result.notes, "not_built": result.not_built,
    }


@click.command()
@click.argument("case_files", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--backend", "-b", "backend_names", multiple=True, help="Backend to run (repeatable; default: the one that found the case, or every available one for a corpus; a case found on a user kernel needs --kernel).")
@click.option("--kernel", "-k", "kernels", multiple=True, help="A user kernel as MODULE:FUNCTION (repeatable).")
@click.option("--ledger", "ledger_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None, help="Known-failure ledger a corpus is judged against (default: golden/ledger.json).")
@click.option("--output", "output_file", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write a corpus's JSON record to this file.")
@click.option("--json", "as_json", is_flag=True)
def replay(case_files: tuple[Path, ...], backend_names: tuple[str, ...], kernels: tuple[str, ...], ledger_file: Path | None,
           output_file: Path | None, as_json: bool) -> None:
    """Re-run a saved case on one backend and print the verdict; exit 1 if it fails, 3 if no verdict (unsupported, error).

    Several case files or a folder (e.g. golden/cases) replay as a corpus on every given (default:
    available) backend, judged against the ledger: known findings, "FIXED in X", new findings;
    --json prints the record pa-oracle replay-compare reads. Exit 1 on a new finding or an
    unexpected pass."""
    from pa_oracle.oracle.case import CaseError
    from pa_oracle.oracle.report import format_report
    from pa_oracle.oracle.tensors import load_case

    if output_file is not None and not output_file.parent.is_dir():  # refused before a case runs, not after the replay
        raise click.UsageError(f"--output {output_file}: no folder {output_file.parent} to write it in (create it first)")
    from pa_oracle.fuzz.campaign.write_files import write_finding_path
    from pa_oracle.fuzz.write_cli import replay_write_finding

    if len(case_files) == 1 and (saved := write_finding_path(case_files[0])) is not None:  # a write kernel's finding
        line, code = replay_write_finding(saved, backend_names, kernels)
        click.echo(line)
        click.get_current_context().exit(code)  # (a sys.exit(0) is taken for a kernel's: exits.ExitCodeGroup)
    if len(case_files) > 1 or case_files[0].is_dir() or len(backend_names) + len(kernels) > 1:
        _replay_corpus(case_files, backend_names, kernels, ledger_file, output_file, as_json)
        return
    case_file = case_files[0]
    try:
        case = load_case(case_file)
    except CaseError as exc:
        raise click.ClickException(str(exc)) from None
    backend_name, kernel = (backend_names or (None,))[0], (kernels or (None,))[0]
    if not backend_name and not kernel:
        backend_name = _found_on(case, case_file)
    backend = _select((backend_name,) if backend_name else (), (kernel,) if kernel else ())[0]
    from pa_oracle.fuzz.campaign.ledger import golden_check
    from pa_oracle.fuzz.checks.registry import ALL_CHECKS
    from pa_oracle.fuzz.run.isolation import BadTimeout, default_case_timeout
    from pa_oracle.fuzz.run.judge import case_judge

    try:
        timeout = default_case_timeout()
        judge = ALL_CHECKS[golden_check(case, case_file)]  # a golden case of a check replays through it
    except (BadTimeout, CaseError) as exc:
        raise click.UsageError(str(exc)) from None
    with case_judge(backend, timeout=timeout, judge=judge) as check:  # isolated as fuzz runs it: a crash replays as "crash"
        outcome = check(case)
    if as_json:
        payload = {"backend": backend.name, "status": outcome.status, "message": outcome.message}
        click.echo(json.dumps(payload, indent=1))
    elif outcome.verdict is not None:
        click.echo(format_report(case, backend.name, outcome.verdict, conversions=backend.conversions(case)))
    else:
        click.echo(f"{backend.name}: {outcome.status.upper()}: {outcome.message}")
    if outcome.status in ("error", "unsupported"):
        sys.exit(3)  # no verdict: the tool could not judge, or the kernel declined the case
    if outcome.is_finding:
        sys.exit(1)


def _found_on(case: Any, case_file: Path) -> str:
    """The registered backend that found ``case`` (its meta, as a finding or a golden case keeps it).
    A user kernel named in the meta is never imported: a case file is data, and only the user's own
    ``--kernel`` runs code (issue 31)."""
    from pa_oracle.fuzz.campaign.finding_record import meta_of

    meta = meta_of(case, case_file)  # (an unreadable meta is bad input naming the file and field)
    kernel = meta.kernel
    if kernel:
        raise click.UsageError(
            f"{case_file} was found on the user kernel {kernel}; a case file imports no code by itself: "
            f"to replay it there, pass --kernel {kernel} (or --kernel MOD:NAME, or -b BACKEND)"
        )
    backend = meta.backend
    if not backend:
        raise click.UsageError(f"{case_file} names no backend that found it (meta.backend): give --backend NAME or --kernel MOD:NAME")
    return backend


def _replay_corpus(paths: tuple[Path, ...], backend_names: tuple[str, ...], kernels: tuple[str, ...],
                   ledger_file: Path | None, output_file: Path | None, as_json: bool) -> None:
    from pa_oracle.backends import BackendSpecError
    from pa_oracle.fuzz.campaign import replay as corpus
    from pa_oracle.fuzz.campaign.ledger import GOLDEN, load_ledger
    from pa_oracle.fuzz.run.isolation import BadTimeout, default_case_timeout
    from pa_oracle.fuzz.run.judge import case_judge
    from pa_oracle.oracle.case import CaseError

    try:
        files = corpus.corpus_files(paths)
        ledger = load_ledger(ledger_file or GOLDEN / "ledger.json")
        timeout = default_case_timeout()
        backends, unavailable = corpus.corpus_backends(corpus.corpus_kinds(files), backend_names, kernels)
    except (corpus.ReplayError, CaseError, BadTimeout, BackendSpecError) as exc:
        raise click.UsageError(str(exc)) from None
    show = (lambda r: click.echo(corpus.record_line(r), err=True)) if as_json else (lambda r: click.echo(corpus.record_line(r)))
    _build_corpus(corpus.corpus_kinds(files).get("attention", []), [b for b in backends if b.kind == "attention"])
    try:
        records = corpus.replay_corpus(files, backends, ledger, lambda b, c: case_judge(b, timeout=timeout, judge=c), show)
    except corpus.ReplayError as exc:
        raise click.UsageError(str(exc)) from None
    document = corpus.replay_document(records, corpus.environment(backends, unavailable))
    text = json.dumps(document, indent=1)
    if output_file is not None:
        output_file.write_text(text + "\n")
    if as_json:
        click.echo(text)
    kinds = [r.ledger for r in records]
    summary = ", ".join(f"{kinds.count(k)} {k}" for k in ("pass", "known", "fixed", "finding", "unexpected-pass", "error", "no-verdict", "quarantine"))
    click.echo(f"replayed {len({r.case for r in records})} cases on {len(backends)} backends: {summary}", err=as_json)
    if any(k in ("finding", "unexpected-pass") for k in kinds):
        sys.exit(1)
    if "error" in kinds:
        sys.exit(3)  # a case the tool could not judge


def _build_corpus(files: list[Path], backends: list[Backend]) -> None:
    """Build every variant the corpus runs on, on every backend, together before judging (one pass, with progress)."""
    from pa_oracle.fuzz.campaign.compile_plan import build_everything, corpus_plan
    from pa_oracle.fuzz.run.isolation import isolatable
    from pa_oracle.oracle.case import CaseError
    from pa_oracle.oracle.tensors import load_case

    cases = []
    for path in files:
        try:
            cases.append(load_case(path))
        except CaseError:
            continue  # replay_corpus reports it, as bad input
    plan = corpus_plan(cases, backends)
    if not any(p.chosen for p in plan.plans.values()):
        return
    say = lambda line: click.echo(line, err=True)  # noqa: E731
    seconds = build_everything(plan, isolatable, say)
    built = sum(len(p.compiled) + len(p.warmed) for p in plan.plans.values())
    failed = sum(len(p.failed) for p in plan.plans.values())
    say(f"built {built} variants in {seconds:.1f}s before judging" + (f" ({failed} failed: their cases compile on first use)" if failed else ""))


@click.command("replay-compare")
@click.argument("before", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("after", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
def replay_compare(before: Path, after: Path, as_json: bool) -> None:
    """Compare two replay --json records (e.g. two library versions): fixed / regressed / same / new
    per case and backend; exit 1 if anything regressed."""
    from dataclasses import asdict

    from pa_oracle.fuzz.campaign import replay as corpus

    try:
        a, b = corpus.load_replay(before), corpus.load_replay(after)
    except corpus.ReplayError as exc:
        raise click.UsageError(str(exc)) from None
    changes = corpus.compare(a, b)
    if as_json:
        click.echo(json.dumps({"versions": corpus.version_changes(a, b), "changes": [asdict(c) for c in changes]}, indent=1))
    else:
        click.echo("\n".join(corpus.comparison_lines(changes, corpus.version_changes(a, b))))
    if any(c.kind == "regressed" for c in changes):
        sys.exit(1)


@click.command()
@click.option("--backend", "-b", "backend_names", multiple=True, help="Backend name (repeatable). Default: every available one.")
@click.option("--kernel", "-k", "kernels", multiple=True, help="A user kernel as MODULE:FUNCTION (repeatable).")
@click.option("--examples", "-n", type=EXAMPLES, default=30, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--only", multiple=True, help="Narrow what is drawn (as for fuzz).")
@click.option("--json", "as_json", is_flag=True)
def properties(backend_names: tuple[str, ...], kernels: tuple[str, ...], examples: int, seed: int, only: tuple[str, ...], as_json: bool) -> None:
    """Report determinism and batch invariance per kernel (properties, not failures)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed
    from pa_oracle.fuzz.checks.properties import measure
    from pa_oracle.fuzz.draw.strategies import cases
    from pa_oracle.oracle.case import Case

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


@click.command()
@click.option("--backend", "-b", "backend_names", multiple=True, help="Backend name (repeatable). Default: every available one.")
@click.option("--kernel", "-k", "kernels", multiple=True, help="A user kernel as MODULE:FUNCTION (repeatable).")
@click.option("--check", "-c", "check_names", multiple=True,
              help="reorder, relabel, alone, merge, window, plan-reuse, stale-plan-pages, stale-plan-lengths, mask-replan, cuda-graph, composed-vs-parts, "
                   "or oracle (the fuzz comparison) (repeatable). Default: all but oracle.")
@click.option("--examples", "-n", type=EXAMPLES, default=30, show_default=True, help="Examples per backend and check.")
@click.option("--seed", default=0, show_default=True)
@click.option("--only", multiple=True, help="Narrow what is drawn (as for fuzz).")
@click.option("--case", "case_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Run the checks on this case instead of drawing cases.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("pa-findings"), show_default=True)
@click.option("--time-budget", type=Seconds(), default=None, help="Seconds for the whole run, shared by the backends and checks.")
@click.option("--isolate/--no-isolate", default=None, help="Run cases in a restartable worker process (default as for fuzz).")
@click.option("--case-timeout", type=Seconds(), default=300.0, show_default=True, help="Seconds before an isolated case counts as a hang.")
@click.option("--resume", is_flag=True, help="Continue the check campaign kept in --out (checks.json) at its next chunk.")
@click.option("--overwrite", is_flag=True, help="Start a new check campaign in an --out that holds one (finding folders are kept).")
@click.option("--rerun-findings", is_flag=True, help="With --resume: run again the checks that stopped at a violation.")
@click.option("--shard", "shard_text", default=None, help="Run only shard I/N of the campaign; state in OUT/shards/checks-I-of-N.json.")
@click.option("--merge", "merge_only", is_flag=True, help="Check nothing: merge the shard states in --out and print the summary.")
@click.option("--skip-known/--no-skip-known", default=True, show_default=True,
              help="Skip drawn cases that a ledger entry of the check (or of the oracle, for checks judged by it) covers.")
@click.option("--ledger", "ledger_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None, help="Known-failure ledger (default: golden/ledger.json).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def metamorphic(ctx: click.Context, **options: Any) -> None:
    """Checks beyond output values: metamorphic relations (kernel vs kernel), plan reuse and stale
    plans, CUDA-graph replay. Exit 1 on any violation. The same as ``fuzz --check NAME`` (every check but
    oracle by default, 30 examples): crash isolation, --time-budget, --resume (state in OUT/checks.json),
    --shard/--merge. One campaign at a time per --out (a lock file); a violation found again never
    replaces its saved folder."""
    from pa_oracle.fuzz.checks.registry import CHECKS

    options["check_names"] = options["check_names"] or tuple(CHECKS)
    run_fuzz(ctx, FuzzOptions(**options, command="metamorphic"))


@click.command()
@click.option("--backend", "-b", "backend_names", multiple=True, help="Write kernel name (repeatable). Default: every available one.")
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
@click.option("--rerun-findings", is_flag=True, help="With --resume: fuzz again the kernels that stopped at a finding.")
@click.option("--isolate/--no-isolate", default=None,
              help="Run cases in a restartable worker process (default: on for --kernel, library and CUDA kernels).")
@click.option("--case-timeout", type=click.FloatRange(min=0, min_open=True, max=86400), default=60.0, show_default=True,
              help="Seconds before an isolated case counts as a hang.")
@click.option("--skip-known/--no-skip-known", default=True, show_default=True,
              help="Skip drawn cases that a ledger entry of the write check covers (--no-skip-known runs them).")
@click.option("--ledger", "ledger_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Skip drawn cases a ledger entry of the write check covers (its 'matches' over write-case fields; "
                   "default: golden/ledger.json).")
@click.option("--workers", type=click.IntRange(1, 4096), default=1, show_default=True,
              help="Worker processes, one shard each (pinned to the GPUs round-robin), merged at the end.")
@click.option("--shard", "shard_text", default=None, help="Run only shard I/N of the campaign; state in OUT/shards/.")
@click.option("--merge", "merge_only", is_flag=True, help="Fuzz nothing: merge the shard states in --out and print the results.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of text.")
@click.pass_context
def writes(ctx: click.Context, **options: Any) -> None:
    """Append ragged batches into canary-filled paged pools and compare every byte: the appended
    slots must hold the appended values (an fp8 cache: quantised once with the case's scale), padding
    rows (slot -1) nothing, and everything else must be unchanged.

    The same as ``pa-oracle fuzz --check write`` (with --out pa-findings/writes and a 60 s case
    timeout): the state in OUT/writes-state.json (--resume, --overwrite), --workers N shards merged at
    the end, --shard I/N and --merge, --json. Exit 1 on any finding."""
    run_fuzz(ctx, FuzzOptions(**options, check_names=(WRITE_CHECK_NAME,), command="writes"))


def _check_result_json(r: BackendResult) -> dict[str, Any]:
    finding = r.findings[-1] if r.findings else None
    return {
        "backend": r.backend, "check": r.check, "examples": r.examples, "held": r.passed, "bit_exact": r.exact,
        "skipped": r.unsupported, "skipped_known": r.skipped_known, "not_applicable": r.not_applicable, "seconds": round(r.seconds, 2),
        "status": r.status, "notes": r.notes,
        "violation": None if finding is None else {
            "status": finding.status, "message": finding.message, "case_id": finding.case_id, "dir": finding.dir, "repro": finding.repro,
        },
    }


@click.command()
@click.option("--examples", "-n", type=EXAMPLES, default=200, show_default=True, help="Budget per planted bug.")
@click.option("--correct-examples", type=EXAMPLES, default=150, show_default=True, help="Examples per correct kernel.")
@click.option("--seed", default=0, show_default=True)
@click.option("--time-budget", type=Seconds(), default=None,
              help="Seconds for the whole selftest: no kernel starts after it and one running is cut; those are listed (exit 3).")
@click.option("--json", "as_json", is_flag=True)
def selftest(examples: int, correct_examples: int, seed: int, time_budget: float | None, as_json: bool) -> None:
    """Detection power: planted bugs found, correct kernels not flagged; exit 1 otherwise.

    One line per kernel as it ends (its time, the time so far and an estimate of the time left).
    Exit 0: every planted bug found and no correct kernel flagged; 1: a bug missed or a false alarm
    (among those that ran); 3: --time-budget ran out before every kernel ran (no verdict on those)."""
    import dataclasses

    from pa_oracle.fuzz.quality.selftest import run_selftest

    results = run_selftest(examples=examples, correct_examples=correct_examples, seed=seed, time_budget=time_budget,
                           progress=lambda line: click.echo(line, err=as_json))
    ran = [r for r in results if r.ran]
    bugs = [r for r in ran if r.planted]
    correct = [r for r in ran if not r.planted]
    not_run = [r.kernel for r in results if not r.ran]
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    else:
        found = sum(r.detected for r in bugs)
        median = sorted(r.examples for r in bugs)[len(bugs) // 2] if bugs else 0
        click.echo(
            f"detection {found}/{len(bugs)} planted bugs (median {median} examples to detection), "
            f"false alarms {sum(r.detected for r in correct)}/{len(correct)} correct kernels"
        )
    if not all(r.ok for r in ran):
        sys.exit(1)
    if not_run:
        click.echo(f"pa-oracle: --time-budget {time_budget:g}s ran out: {len(not_run)} of {len(results)} kernels did not run "
                   f"(or were cut): {', '.join(not_run)}; no verdict on them", err=True)
        sys.exit(3)
