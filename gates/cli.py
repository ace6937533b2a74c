"""``pa-oracle gate ...``: end-to-end accuracy gates on a real model (exit 1 when a gate fails).

Commands import ``transformers`` lazily, so ``pa-oracle`` works without it.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from pa_oracle.gates.gsm8k import FILTERS as GSM8K_FILTERS

if TYPE_CHECKING:  # the commands import what they use: `pa-oracle gate --help` imports no torch
    from pa_oracle.gates import gsm8k as g
    from pa_oracle.gates.logits import LogitGateConfig, Thresholds
    from pa_oracle.gates.models import LoadedModel


@click.group()
def gate() -> None:
    """End-to-end gates: a model's attention runs through a backend and is compared with a reference."""


def model_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options that say which model to load and how (shared by the gate commands)."""
    options = [
        click.option("--model", "model_path", required=True,
                     help="Model folder, hub id (already cached), or a .gguf file."),
        click.option("--gguf-file", default=None, help="GGUF file inside --model (or a path to one)."),
        click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
                     show_default=True, help="Model dtype; auto: bfloat16 on CUDA, float32 on CPU."),
        click.option("--device", default=None, help="torch device (default: cuda if available, else cpu)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@dataclass(frozen=True, kw_only=True)
class ModelChoice:
    """Which model a gate loads and how (``model_options``)."""

    model_path: str
    gguf_file: str | None = None
    dtype: str = "auto"
    device: str | None = None


def load_for_gate(choice: ModelChoice) -> LoadedModel:
    """``pa_oracle.gates.models.load_model`` with the CLI's defaults; bad paths are usage errors."""
    import torch
    from pa_oracle.gates.models import load_model

    device = choice.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = choice.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    gguf_file = choice.gguf_file
    if gguf_file is None and choice.model_path.endswith(".gguf"):
        gguf_file = choice.model_path
    try:
        return load_model(choice.model_path, gguf_file=gguf_file, dtype=dtype, attn_implementation="sdpa", device=device)
    except (OSError, ValueError) as exc:
        raise click.UsageError(f"cannot load model {choice.model_path}: {exc}") from None


class _NoVerdict(click.ClickException):
    """The gate could not judge the backend (exit 3, as ``pa_oracle.fuzz.exits.TOOL_FAILED``)."""

    exit_code = 3


def _kernel_failed(gate_name: str, exc: Any, backend: str, *also_under_test: str | None) -> None:
    """A backend broke its contract inside the model (``swap.KernelFailed``): the gate fails (exit 1) when it is
    the backend under the gate (or ``also_under_test``: its prefill partner); the reference's failure is no
    verdict (exit 3)."""
    if exc.backend not in (backend, *also_under_test):
        raise _NoVerdict(f"{gate_name}: no verdict on {backend}: {exc}")
    click.echo(f"{gate_name} FAILED: {exc}", err=True)
    sys.exit(1)


def _usage_error(exc: BaseException) -> click.UsageError:
    """A refusal (a bad backend name, a setting the gate cannot run) as a usage error (exit 2), with
    its message as written (``str()`` of a KeyError quotes it)."""
    message = exc.args[0] if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str) else str(exc)
    return click.UsageError(message)


@gate.command()
@model_options
@click.option("--backend", "-b", required=True,
              help="Backend under test: a registry name, oracle, control, MODULE:FUNCTION, or hf:IMPL (stock transformers).")
@click.option("--reference", "-r", default="oracle", show_default=True, help="Reference, same forms as --backend.")
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder with GSM8k {split}.jsonl (question/answer), as the hub's openai/gsm8k ships them.")
@click.option("--split", default="test", show_default=True)
@click.option("--limit", "-n", default=64, show_default=True, help="Texts to score (the first N of the split).")
@click.option("--batch-size", default=8, show_default=True)
@click.option("--padding", type=click.Choice(["left", "right"]), default="left", show_default=True)
@click.option("--mode", type=click.Choice(["prefill", "decode"]), default="prefill", show_default=True,
              help="prefill: whole texts in one forward; decode: answer tokens one step at a time (KV cache).")
@click.option("--prefill", "prefill_backend", default=None,
              help="decode mode: the backend that prefills the prompt in the backend's run (default: the reference).")
@click.option("--page-size", type=int, default=None, help="KV page size (default: 16, or the backend's smallest above it).")
@click.option("--seed", default=0, show_default=True, help="Seeds the random page tables.")
@click.option("--max-mean-kl", type=float, default=None, help="Override the dtype's calibrated bound.")
@click.option("--max-kl", type=float, default=None, help="Override the dtype's calibrated bound.")
@click.option("--min-top1", type=float, default=None, help="Override the dtype's calibrated bound.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write result.json and report.md here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def logits(**options: Any) -> None:
    """Teacher-forced logit gate on GSM8k answers: KL, top-1 agreement; exit 1 if it fails.

    Thresholds per model dtype: README "Accuracy gates"."""
    run_logits(LogitsOptions(**options))


@dataclass(frozen=True, kw_only=True)
class LogitsOptions(ModelChoice):
    """What ``gate logits`` was asked, as the command line gave it."""

    backend: str
    data_dir: Path
    reference: str = "oracle"
    split: str = "test"
    limit: int = 64
    batch_size: int = 8
    padding: str = "left"
    mode: str = "prefill"
    prefill_backend: str | None = None
    page_size: int | None = None
    seed: int = 0
    max_mean_kl: float | None = None
    max_kl: float | None = None
    min_top1: float | None = None
    out_dir: Path | None = None
    as_json: bool = False

    def gate_config(self) -> LogitGateConfig:
        """The gate's settings (thresholds: the model dtype's, set once it is loaded); a usage error if they cannot run."""
        from pa_oracle.gates.logits import LogitGateConfig

        try:
            return LogitGateConfig(
                backend=self.backend, reference=self.reference, batch_size=self.batch_size, padding_side=self.padding,
                mode=self.mode, prefill=self.prefill_backend, page_size=self.page_size, seed=self.seed,
            )
        except ValueError as exc:
            raise _usage_error(exc) from None

    def thresholds_for(self, model_dtype: str) -> Thresholds:
        """The model dtype's calibrated bounds with the ones given on the command line instead."""
        import dataclasses

        from pa_oracle.gates.logits import THRESHOLDS

        bounds = (("mean_kl", self.max_mean_kl), ("max_kl", self.max_kl), ("min_top1", self.min_top1))
        overrides = {name: value for name, value in bounds if value is not None}
        return dataclasses.replace(THRESHOLDS[model_dtype], **overrides)


def run_logits(opts: LogitsOptions) -> None:
    """Run the logit gate ``opts`` asks for, print (and with ``--out`` write) its result; exit 1 if it fails."""
    import dataclasses

    from pa_oracle.gates.data import read_gsm8k
    from pa_oracle.gates.logits import gsm8k_texts, run_logit_gate, write_result
    from pa_oracle.gates.swap import KernelFailed, SwapError

    try:
        texts = gsm8k_texts(read_gsm8k(opts.data_dir, split=opts.split, limit=opts.limit))
    except (OSError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    config = opts.gate_config()
    loaded = load_for_gate(opts)
    model_dtype = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")
    config = dataclasses.replace(config, thresholds=opts.thresholds_for(model_dtype))
    click.echo(
        f"logit gate: {opts.backend} vs {opts.reference} on {loaded.source} ({model_dtype}), {len(texts)} texts, "
        f"{opts.mode} mode",
        err=True,
    )
    try:
        with forward_progress("scoring") as progress:
            result = run_logit_gate(loaded.model, loaded.tokenizer, texts, config, model_name=loaded.source,
                                    progress=progress)
    except KernelFailed as exc:
        _kernel_failed("logit gate", exc, opts.backend)
    except (SwapError, KeyError, ValueError, ImportError) as exc:
        raise _usage_error(exc) from None
    if opts.out_dir is not None:
        write_result(result, opts.out_dir)
    click.echo(json.dumps(result.to_json(), indent=1) if opts.as_json else result.to_markdown())
    if not result.passed:
        sys.exit(1)


@contextlib.contextmanager
def forward_progress(label: str, lines: int = 10) -> Iterator[Callable[[int, int], None]]:
    """A ``progress(done, total)`` callback (forward passes) that draws a bar on a terminal
    (click's bar prints only its label elsewhere), and in a log prints ``lines`` lines in all
    (every 10% by default) with the elapsed seconds."""
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        bar: Any = None

        def progress(done: int, total: int) -> None:
            nonlocal bar
            if sys.stderr.isatty():
                if bar is None:
                    bar = stack.enter_context(click.progressbar(length=total, label=label, file=sys.stderr))
                bar.update(done - bar.pos)
            elif done * lines // total > (done - 1) * lines // total:
                click.echo(f"{label}: {done}/{total} forward passes, {time.monotonic() - start:.1f} s", err=True)

        yield progress


def _command_line(ctx: click.Context) -> str:
    """The command that reruns ``ctx``'s command: ``pa-oracle``, the subcommands, and every option
    given on the command line (however the CLI was started: ``pa-oracle`` or ``python -m pa_oracle``)."""
    import shlex

    from click.core import ParameterSource

    names, parent = [], ctx
    while parent.parent is not None:
        names.append(parent.info_name or "")
        parent = parent.parent
    words = ["pa-oracle", *reversed(names)]
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or ctx.get_parameter_source(param.name) != ParameterSource.COMMANDLINE:
            continue
        value, flag = ctx.params[param.name], max(param.opts, key=len)
        if param.is_flag:
            words.append(flag)
        else:
            for item in value if param.multiple else (value,):
                words += [flag, str(item)]
    return shlex.join(words)


GPU_BATCH, CPU_BATCH = 256, 8  # --batch-size auto: questions per generate() call (a batch runs until its longest answer stops)


def _batch_size(text: str, device: str) -> int:
    if text == "auto":
        return GPU_BATCH if device.startswith("cuda") else CPU_BATCH
    if not text.isdigit() or int(text) < 1:
        raise click.BadParameter(f"takes a positive integer or auto, got {text!r}", param_hint="--batch-size")
    return int(text)


def _gsm8k_report_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options that judge and report (shared by ``gsm8k`` and ``gsm8k-merge``)."""
    options = [
        click.option("--expected", "expected_file", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
                     help="Golden expected accuracy (default: golden/gsm8k/<model>.json when it exists)."),
        click.option("--margin", type=click.FloatRange(0, 1), default=None,
                     help="Fail if the backend's Wilson lower bound < expected - margin (default: the smallest margin whose false-alarm rate is <= alpha)."),
        click.option("--alpha", type=click.FloatRange(0, 0.5, min_open=True, max_open=True), default=0.05, show_default=True),
        click.option("--filter", "gated", multiple=True, type=click.Choice(GSM8K_FILTERS), default=("flexible-extract",),
                     show_default=True, help="lm-eval filter(s) that decide the verdict (both are reported)."),
        click.option("--save-expected", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Write the reference run's accuracy to this golden file (whole runs only, not one shard)."),
        click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("pa-gates"), show_default=True),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _gguf_path(model_path: str, gguf_file: str | None) -> Path | None:
    """The GGUF file the model loads from (as ``pa_oracle.gates.models.load_model`` finds it), if it is one."""
    name = gguf_file or (model_path if model_path.endswith(".gguf") else None)
    if name is None:
        return None
    for path in (Path(name), Path(model_path) / name):
        if path.is_file():
            return path
    return None


@dataclass(frozen=True, kw_only=True)
class ReportOptions:
    """How a GSM8k gate is judged and reported (``_gsm8k_report_options``: ``gsm8k`` and ``gsm8k-merge``)."""

    expected_file: Path | None = None
    margin: float | None = None
    alpha: float = 0.05
    gated: tuple[str, ...] = ("flexible-extract",)
    save_expected: Path | None = None
    out_dir: Path = Path("pa-gates")
    as_json: bool = False

    def criteria(self) -> g.Criteria:
        from pa_oracle.gates import gsm8k as g

        return g.Criteria(alpha=self.alpha, gated=self.gated, margin=self.margin)


@dataclass(frozen=True)
class _Expected:
    """The golden expected accuracy a gate is held to (None: none), and the file it came from."""

    record: g.Expected | None
    file: Path | None


def _expected_for(key: str, settings: g.TaskSettings, expected_file: Path | None, model_sha256: str) -> _Expected:
    """``expected_file``, else ``golden/gsm8k/<key>.json`` where it exists; checked against the run's task."""
    from pa_oracle.gates import gsm8k as g

    default_expected = g.EXPECTED_DIR / f"{key}.json"
    expected_file = expected_file or (default_expected if default_expected.is_file() else None)
    expected = g.load_expected(expected_file) if expected_file else None
    if expected is not None:
        g.check_expected(expected, model=key, settings=settings, model_sha256=model_sha256)
    return _Expected(expected, expected_file)


def _gate_folder(out_dir: Path, saved: g.SavedRuns) -> Path:
    shard = "" if saved.shard is None else f"-shard-{saved.shard.index}-of-{saved.shard.count}"
    return out_dir / "gsm8k" / re.sub(r"[^A-Za-z0-9_.-]", "_", f"{saved.backend}-vs-{saved.reference}{shard}")


def _judge_and_report(ctx: click.Context, saved: g.SavedRuns, expected: _Expected, report: ReportOptions) -> None:
    """Judge ``saved``, write its reports and runs, print the verdict, exit 1 on FAIL."""
    from pa_oracle.gates import gsm8k as g

    backend, reference = saved.outcomes[saved.backend], saved.outcomes[saved.reference]
    if report.save_expected is not None:
        record = g.expected_from_run(reference, model=saved.model, settings=saved.settings,
                                     model_sha256=saved.model_sha256, dtype=saved.dtype)
        g.save_expected(report.save_expected, record)
        click.echo(f"expected accuracy written to {report.save_expected}", err=True)
    try:
        result = g.judge(
            backend, reference, model=saved.model, settings=saved.settings, criteria=report.criteria(),
            expected=expected.record, expected_source=str(expected.file) if expected.file else None,
        )
    except g.GateInputError as exc:
        raise click.ClickException(str(exc)) from None
    folder = _gate_folder(report.out_dir, saved)
    json_path, md_path = g.write_reports(folder, result, backend, reference, command=_command_line(ctx))
    saved.save(folder)
    if report.as_json:
        click.echo(json.dumps(g.result_json(result, backend, reference), indent=1))
    else:
        _print_verdict(saved, result, f"  report: {md_path} (+ {json_path.name}, {g.RUNS_FILE})")
    if not result.passed:
        sys.exit(1)


def _print_verdict(saved: g.SavedRuns, result: g.GateResult, where: str) -> None:
    click.echo(f"GSM8k gate {'PASS' if result.passed else 'FAIL'}: {saved.backend} vs {saved.reference}"
               f"{'' if saved.shard is None else f' (shard {saved.shard})'}")
    for line in result.failures:
        click.echo(f"  {line}")
    for name, verdict in result.verdicts.items():
        click.echo(
            f"  {name}: backend {100 * verdict.backend_accuracy:.1f}%, reference {100 * verdict.reference_accuracy:.1f}% "
            f"(n={verdict.n}), lost {verdict.mcnemar.losses} / won {verdict.mcnemar.wins}, "
            f"McNemar p(worse) = {verdict.mcnemar.p_backend_worse:.3g}"
        )
    click.echo(where)


@gate.command()
@model_options
@click.option("--backend", "-b", required=True, help="Backend under test: a registry name, oracle, control, MODULE:NAME, or hf:IMPL.")
@click.option("--reference", "-r", default="hf:sdpa", show_default=True,
              help="Reference, same forms as --backend. The default is transformers' own SDPA (fast); "
                   "oracle (float64) works too but is the logit gate's reference, too slow for 1319 questions.")
@click.option("--limit", "-n", type=click.IntRange(min=1), default=None, help="The first N test questions (default: all 1319).")
@click.option("--shard", "shard_text", default=None,
              help="I/N: only the questions whose doc id is I-1 mod N (same prompts as unsharded); merge with gate gsm8k-merge.")
@click.option("--num-fewshot", type=click.IntRange(min=0), default=5, show_default=True)
@click.option("--max-gen-toks", type=click.IntRange(min=1), default=256, show_default=True, help="Generation budget per question.")
@click.option("--data", "gsm8k_data", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="Folder with test.jsonl and train.jsonl (offline); default: lm-eval's hub dataset openai/gsm8k.")
@click.option("--batch-size", "batch_text", default="auto", show_default=True,
              help=f"Questions per generate() call; auto: {GPU_BATCH} on CUDA, {CPU_BATCH} on CPU.")
@click.option("--prefill", "prefill_backend", default=None,
              help="The backend that serves the prompt's forward (every call with more than one query) in the backend's "
                   "run, as engines pair a decode kernel with a prefill one; both are under the gate.")
@click.option("--page-size", type=int, default=None, help="KV page size (default: 16, or the backend's smallest above it).")
@click.option("--seed", default=0, show_default=True, help="Seeds the random page tables.")
@click.option("--reference-run", type=click.Path(exists=True, path_type=Path), default=None,
              help="runs.json (or its folder) of an earlier gate on the same model, task, limit and shard: reuse its reference run instead of running the reference again.")
@_gsm8k_report_options
@click.pass_context
def gsm8k(ctx: click.Context, **options: Any) -> None:
    """lm-eval GSM8k with the backend and with the reference; exit 1 if McNemar finds the backend
    worse or its accuracy falls below the golden expected one."""
    run_gsm8k_gate(ctx, Gsm8kOptions(**options))


@dataclass(frozen=True, kw_only=True)
class Gsm8kOptions(ReportOptions, ModelChoice):
    """What ``gate gsm8k`` was asked, as the command line gave it."""

    backend: str
    reference: str = "hf:sdpa"
    limit: int | None = None
    shard_text: str | None = None
    num_fewshot: int = 5
    max_gen_toks: int = 256
    gsm8k_data: Path | None = None
    batch_text: str = "auto"
    prefill_backend: str | None = None
    page_size: int | None = None
    seed: int = 0
    reference_run: Path | None = None

    @property
    def backend_label(self) -> str:
        """The backend run's name in the runs and reports: the backend, and its prefill partner when given."""
        return self.backend if self.prefill_backend is None else f"{self.backend}+prefill={self.prefill_backend}"

    def refuse_conflicts(self) -> None:
        """Options that cannot go together: a usage error (exit 2) before anything runs."""
        if self.backend == self.reference:
            raise click.UsageError(f"--backend and --reference must differ (both {self.backend})")
        if self.shard_text and self.save_expected is not None:
            raise click.UsageError("--save-expected needs the whole run: save it from gate gsm8k-merge")


@dataclass(frozen=True)
class _Gsm8kPlan:
    """What a GSM8k gate runs, found before the model is loaded: the attention implementations still
    to run (the reference's unless reused, then the backend's) and what the verdict is held to."""

    shard: g.Shard | None
    settings: g.TaskSettings
    key: str  # the model's golden name
    model_sha256: str
    expected: _Expected
    reused: g.SavedRuns | None  # --reference-run
    runs: dict[str, str]  # label -> attention implementation


def _plan_gsm8k(opts: Gsm8kOptions) -> _Gsm8kPlan:
    """The gate's plan; bad input (a shard, an expected file, a reference run, a backend) is a usage error."""
    from pa_oracle.gates import gsm8k as g
    from pa_oracle.gates.swap import SwapError, attn_implementation_for

    try:
        shard = g.Shard.parse(opts.shard_text) if opts.shard_text else None
        settings = g.TaskSettings(num_fewshot=opts.num_fewshot, max_gen_toks=opts.max_gen_toks)
        key = g.model_key(opts.model_path, opts.gguf_file)
        gguf_path = _gguf_path(opts.model_path, opts.gguf_file)
        model_sha256 = g.file_sha256(gguf_path) if gguf_path is not None else ""
        expected = _expected_for(key, settings, opts.expected_file, model_sha256)
        reused = g.SavedRuns.load(opts.reference_run) if opts.reference_run is not None else None
        if reused is not None and reused.reference != opts.reference:
            raise g.GateInputError(
                f"--reference-run {opts.reference_run} ran reference {reused.reference}, this gate {opts.reference}"
            )
        to_run = [opts.reference] if reused is None else []
        runs = {label: attn_implementation_for(label, page_size=opts.page_size, seed=opts.seed) for label in to_run}
        runs[opts.backend_label] = attn_implementation_for(opts.backend, page_size=opts.page_size, seed=opts.seed,
                                                           prefill=opts.prefill_backend)
    except (g.GateInputError, SwapError, KeyError, ValueError, ImportError) as exc:
        raise _usage_error(exc) from None
    return _Gsm8kPlan(shard, settings, key, model_sha256, expected, reused, runs)


def run_gsm8k_gate(ctx: click.Context, opts: Gsm8kOptions) -> None:
    """Run the GSM8k gate ``opts`` asks for (each run saved as it ends), judge and report it; exit 1 if it fails."""
    import importlib.metadata
    import importlib.util

    from pa_oracle.gates import gsm8k as g
    from pa_oracle.gates.swap import KernelFailed, SwapError

    if importlib.util.find_spec("lm_eval") is None:
        raise click.UsageError("the GSM8k gate needs lm-eval: pip install 'paged-attention-oracle[eval]'")
    opts.refuse_conflicts()
    plan = _plan_gsm8k(opts)
    loaded = load_for_gate(opts)
    weights = next(loaded.model.parameters())
    batch_size = _batch_size(opts.batch_text, str(weights.device))
    saved = g.SavedRuns(plan.key, plan.settings, opts.limit, plan.shard, opts.backend_label, opts.reference, {},
                        plan.model_sha256, str(weights.dtype).removeprefix("torch."),
                        importlib.metadata.version("lm-eval"))
    if plan.reused is not None:
        _reuse_reference(saved, plan.reused, opts)
    questions = g.Questions(limit=opts.limit, shard=plan.shard, data_dir=opts.gsm8k_data)
    for step, (label, implementation) in enumerate(plan.runs.items(), 1):
        click.echo(
            f"[{step}/{len(plan.runs)}] gsm8k {plan.settings.num_fewshot}-shot, {opts.limit or 'all'} questions"
            f"{'' if plan.shard is None else f', shard {plan.shard}'}, batch {batch_size}, attention: {label}", err=True,
        )
        try:
            saved.outcomes[label] = g.run_gsm8k(
                loaded.model, loaded.tokenizer, attn_implementation=implementation, label=label,
                settings=plan.settings, questions=questions, batch_size=batch_size,
            )
        except KernelFailed as exc:
            # the prefill partner serves only the backend's run: the same name failing in the reference's is no verdict
            partner = opts.prefill_backend if label == opts.backend_label else None
            _kernel_failed(f"gsm8k gate ({label})", exc, opts.backend, partner)
        except (g.GateInputError, SwapError) as exc:
            raise click.ClickException(f"{label}: {exc}") from None
        run = saved.outcomes[label]
        accuracy = ", ".join(f"{f} {100 * run.accuracy(f):.1f}%" for f in sorted(run.correct))
        click.echo(f"      {label}: {accuracy} ({run.seconds:.0f} s)", err=True)
        # saved after each run: a gate cut short keeps its reference run for --reference-run
        runs_path = saved.save(_gate_folder(opts.out_dir, saved))
        click.echo(f"      saved to {runs_path}", err=True)
    _judge_and_report(ctx, saved, plan.expected, opts)


def _reuse_reference(saved: g.SavedRuns, reused: g.SavedRuns, opts: Gsm8kOptions) -> None:
    """Take the reference run of ``--reference-run`` into ``saved``: it must have run the same task and shard."""
    from pa_oracle.gates import gsm8k as g

    try:
        saved.same_task(reused, what=f"--reference-run {opts.reference_run}")
        if reused.shard != saved.shard:
            raise g.GateInputError(f"--reference-run {opts.reference_run} ran shard {reused.shard}, this gate {saved.shard}")
    except g.GateInputError as exc:
        raise click.UsageError(str(exc)) from None
    saved.outcomes[opts.reference] = reused.outcomes[opts.reference]
    click.echo(f"reference {opts.reference}: reused from {opts.reference_run}", err=True)


@gate.command("gsm8k-merge")
@click.argument("folders", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@_gsm8k_report_options
@click.pass_context
def gsm8k_merge(ctx: click.Context, folders: tuple[Path, ...], **options: Any) -> None:
    """Merge the shards of a GSM8k gate (their report folders or runs.json files, each of
    --shard 1/N .. N/N once) into one verdict, as if it had run unsharded; exit 1 if it fails."""
    from pa_oracle.gates import gsm8k as g

    report = ReportOptions(**options)
    try:
        saved = g.merge_saved([g.SavedRuns.load(folder) for folder in folders])
        expected = _expected_for(saved.model, saved.settings, report.expected_file, saved.model_sha256)
    except g.GateInputError as exc:
        raise click.UsageError(str(exc)) from None
    _judge_and_report(ctx, saved, expected, report)
