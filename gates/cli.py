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
from pathlib import Path
from typing import Any

import click
from pa_oracle.gates.gsm8k import FILTERS as GSM8K_FILTERS


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


def load_for_gate(model_path: str, gguf_file: str | None, dtype: str, device: str | None) -> Any:
    """``pa_oracle.gates.models.load_model`` with the CLI's defaults; bad paths are usage errors."""
    import torch
    from pa_oracle.gates.models import load_model

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    if gguf_file is None and model_path.endswith(".gguf"):
        gguf_file = model_path
    try:
        return load_model(model_path, gguf_file=gguf_file, dtype=dtype, attn_implementation="sdpa", device=device)
    except (OSError, ValueError) as exc:
        raise click.UsageError(f"cannot load model {model_path}: {exc}") from None


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
def logits(
    model_path: str, gguf_file: str | None, dtype: str, device: str | None, backend: str, reference: str, data_dir: Path,
    split: str, limit: int, batch_size: int, padding: str, mode: str, prefill_backend: str | None, page_size: int | None,
    seed: int, max_mean_kl: float | None, max_kl: float | None, min_top1: float | None, out_dir: Path | None,
    as_json: bool,
) -> None:
    """Teacher-forced logit gate on GSM8k answers: KL, top-1 agreement; exit 1 if it fails.

    Thresholds per model dtype: README "Accuracy gates"."""
    import dataclasses

    from pa_oracle.gates.data import read_gsm8k
    from pa_oracle.gates.logits import THRESHOLDS, gsm8k_texts, run_logit_gate, write_result
    from pa_oracle.gates.swap import SwapError

    try:
        texts = gsm8k_texts(read_gsm8k(data_dir, split=split, limit=limit))
    except (OSError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    loaded = load_for_gate(model_path, gguf_file, dtype, device)
    model_dtype = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")
    bounds = (("mean_kl", max_mean_kl), ("max_kl", max_kl), ("min_top1", min_top1))
    overrides = {name: value for name, value in bounds if value is not None}
    thresholds = dataclasses.replace(THRESHOLDS[model_dtype], **overrides)
    click.echo(
        f"logit gate: {backend} vs {reference} on {loaded.source} ({model_dtype}), {len(texts)} texts, {mode} mode",
        err=True,
    )
    try:
        with forward_progress("scoring") as progress:
            result = run_logit_gate(
                loaded.model, loaded.tokenizer, texts, backend=backend, reference=reference, batch_size=batch_size,
                padding_side=padding, mode=mode, prefill=prefill_backend, page_size=page_size, seed=seed,
                thresholds=thresholds, model_name=loaded.source, progress=progress,
            )
    except (SwapError, KeyError, ValueError, ImportError) as exc:
        raise click.UsageError(str(exc).strip("'\"")) from None
    if out_dir is not None:
        write_result(result, out_dir)
    click.echo(json.dumps(result.to_json(), indent=1) if as_json else result.to_markdown())
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


def _expected_for(g: Any, key: str, settings: Any, expected_file: Path | None, model_sha256: str) -> tuple[Any, Path | None]:
    default_expected = g.EXPECTED_DIR / f"{key}.json"
    expected_file = expected_file or (default_expected if default_expected.is_file() else None)
    expected = g.load_expected(expected_file) if expected_file else None
    if expected is not None:
        g.check_expected(expected, model=key, settings=settings, model_sha256=model_sha256)
    return expected, expected_file


def _gate_folder(out_dir: Path, saved: Any) -> Path:
    shard = "" if saved.shard is None else f"-shard-{saved.shard.index}-of-{saved.shard.count}"
    return out_dir / "gsm8k" / re.sub(r"[^A-Za-z0-9_.-]", "_", f"{saved.backend}-vs-{saved.reference}{shard}")


def _judge_and_report(
    saved: Any, *, expected: Any, expected_file: Path | None, margin: float | None, alpha: float, gated: tuple[str, ...],
    save_expected: Path | None, out_dir: Path, as_json: bool,
) -> None:
    """Judge ``saved`` (a ``pa_oracle.gates.gsm8k.SavedRuns``), write its reports and runs, print the verdict, exit 1 on FAIL."""
    from pa_oracle.gates import gsm8k as g

    backend, reference = saved.outcomes[saved.backend], saved.outcomes[saved.reference]
    if save_expected is not None:
        record = g.expected_from_run(reference, model=saved.model, settings=saved.settings,
                                     model_sha256=saved.model_sha256, dtype=saved.dtype)
        g.save_expected(save_expected, record)
        click.echo(f"expected accuracy written to {save_expected}", err=True)
    try:
        result = g.judge(
            backend, reference, model=saved.model, settings=saved.settings, alpha=alpha, gated=gated,
            expected=expected, expected_source=str(expected_file) if expected_file else None, margin=margin,
        )
    except g.GateInputError as exc:
        raise click.ClickException(str(exc)) from None
    command = _command_line(click.get_current_context())
    folder = _gate_folder(out_dir, saved)
    json_path, md_path = g.write_reports(folder, result, backend, reference, command=command)
    saved.save(folder)
    if as_json:
        click.echo(json.dumps(g.result_json(result, backend, reference), indent=1))
    else:
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
        click.echo(f"  report: {md_path} (+ {json_path.name}, {g.RUNS_FILE})")
    if not result.passed:
        sys.exit(1)


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
@click.option("--page-size", type=int, default=None, help="KV page size (default: 16, or the backend's smallest above it).")
@click.option("--seed", default=0, show_default=True, help="Seeds the random page tables.")
@click.option("--reference-run", type=click.Path(exists=True, path_type=Path), default=None,
              help="runs.json (or its folder) of an earlier gate on the same model, task, limit and shard: reuse its reference run instead of running the reference again.")
@_gsm8k_report_options
def gsm8k(
    model_path: str, gguf_file: str | None, dtype: str, device: str | None, backend: str, reference: str,
    limit: int | None, shard_text: str | None, num_fewshot: int, max_gen_toks: int, gsm8k_data: Path | None,
    batch_text: str, page_size: int | None, seed: int, reference_run: Path | None, expected_file: Path | None,
    margin: float | None, alpha: float, gated: tuple[str, ...], save_expected: Path | None, out_dir: Path, as_json: bool,
) -> None:
    """lm-eval GSM8k with the backend and with the reference; exit 1 if McNemar finds the backend
    worse or its accuracy falls below the golden expected one."""
    import importlib.metadata
    import importlib.util

    from pa_oracle.gates import gsm8k as g
    from pa_oracle.gates.swap import SwapError, attn_implementation_for

    if importlib.util.find_spec("lm_eval") is None:
        raise click.UsageError("the GSM8k gate needs lm-eval: pip install 'paged-attention-oracle[eval]'")
    if backend == reference:
        raise click.UsageError(f"--backend and --reference must differ (both {backend})")
    try:
        shard = g.Shard.parse(shard_text) if shard_text else None
        if shard is not None and save_expected is not None:
            raise g.GateInputError("--save-expected needs the whole run: save it from gate gsm8k-merge")
        settings = g.TaskSettings(num_fewshot=num_fewshot, max_gen_toks=max_gen_toks)
        key = g.model_key(model_path, gguf_file)
        gguf_path = _gguf_path(model_path, gguf_file)
        model_sha256 = g.file_sha256(gguf_path) if gguf_path is not None else ""
        expected, expected_file = _expected_for(g, key, settings, expected_file, model_sha256)
        reused = g.SavedRuns.load(reference_run) if reference_run is not None else None
        if reused is not None and reused.reference != reference:
            raise g.GateInputError(f"--reference-run {reference_run} ran reference {reused.reference}, this gate {reference}")
        to_run = [reference] if reused is None else []
        runs = {label: attn_implementation_for(label, page_size=page_size, seed=seed) for label in [*to_run, backend]}
    except (g.GateInputError, SwapError, KeyError, ValueError, ImportError) as exc:
        raise click.UsageError(str(exc).strip("'\"")) from None
    loaded = load_for_gate(model_path, gguf_file, dtype, device)
    weights = next(loaded.model.parameters())
    model_dtype = str(weights.dtype).removeprefix("torch.")
    batch_size = _batch_size(batch_text, str(weights.device))
    saved = g.SavedRuns(key, settings, limit, shard, backend, reference, {}, model_sha256, model_dtype,
                        importlib.metadata.version("lm-eval"))
    if reused is not None:
        try:
            saved.same_task(reused, what=f"--reference-run {reference_run}")
            if reused.shard != shard:
                raise g.GateInputError(f"--reference-run {reference_run} ran shard {reused.shard}, this gate {shard}")
        except g.GateInputError as exc:
            raise click.UsageError(str(exc)) from None
        saved.outcomes[reference] = reused.outcomes[reference]
        click.echo(f"reference {reference}: reused from {reference_run}", err=True)
    for step, (label, implementation) in enumerate(runs.items(), 1):
        click.echo(
            f"[{step}/{len(runs)}] gsm8k {settings.num_fewshot}-shot, {limit or 'all'} questions"
            f"{'' if shard is None else f', shard {shard}'}, batch {batch_size}, attention: {label}", err=True,
        )
        try:
            saved.outcomes[label] = g.run_gsm8k(
                loaded.model, loaded.tokenizer, attn_implementation=implementation, label=label, settings=settings,
                limit=limit, data_dir=gsm8k_data, batch_size=batch_size, shard=shard,
            )
        except (g.GateInputError, SwapError) as exc:
            raise click.ClickException(f"{label}: {exc}") from None
        run = saved.outcomes[label]
        accuracy = ", ".join(f"{f} {100 * run.accuracy(f):.1f}%" for f in sorted(run.correct))
        click.echo(f"      {label}: {accuracy} ({run.seconds:.0f} s)", err=True)
        # saved after each run: a gate cut short keeps its reference run for --reference-run
        runs_path = saved.save(_gate_folder(out_dir, saved))
        click.echo(f"      saved to {runs_path}", err=True)
    _judge_and_report(saved, expected=expected, expected_file=expected_file, margin=margin, alpha=alpha, gated=gated,
                      save_expected=save_expected, out_dir=out_dir, as_json=as_json)


@gate.command("gsm8k-merge")
@click.argument("folders", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@_gsm8k_report_options
def gsm8k_merge(
    folders: tuple[Path, ...], expected_file: Path | None, margin: float | None, alpha: float, gated: tuple[str, ...],
    save_expected: Path | None, out_dir: Path, as_json: bool,
) -> None:
    """Merge the shards of a GSM8k gate (their report folders or runs.json files, each of
    --shard 1/N .. N/N once) into one verdict, as if it had run unsharded; exit 1 if it fails."""
    from pa_oracle.gates import gsm8k as g

    try:
        saved = g.merge_saved([g.SavedRuns.load(folder) for folder in folders])
        expected, expected_file = _expected_for(g, saved.model, saved.settings, expected_file, saved.model_sha256)
    except g.GateInputError as exc:
        raise click.UsageError(str(exc)) from None
    _judge_and_report(saved, expected=expected, expected_file=expected_file, margin=margin, alpha=alpha, gated=gated,
                      save_expected=save_expected, out_dir=out_dir, as_json=as_json)
