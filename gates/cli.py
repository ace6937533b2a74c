"""``pa-oracle gate ...``: end-to-end accuracy gates on a real model (exit 1 when a gate fails).

Commands import ``transformers`` lazily, so ``pa-oracle`` works without it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from gates.data import DEFAULT_DATA


@click.group()
def gate() -> None:
    """End-to-end gates: a model's attention runs through a backend and is compared with a reference."""


def model_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options that say which model to load and how (shared by the gate commands)."""
    options = [
        click.option("--model", "model_path", required=True, help="Model folder, hub id (already cached), or a .gguf file."),
        click.option("--gguf-file", default=None, help="GGUF file inside --model (or a path to one)."),
        click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
                     show_default=True, help="Model dtype; auto: bfloat16 on CUDA, float32 on CPU."),
        click.option("--device", default=None, help="torch device (default: cuda if available, else cpu)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def load_for_gate(model_path: str, gguf_file: str | None, dtype: str, device: str | None) -> Any:
    """``gates.models.load_model`` with the CLI's defaults; bad paths are usage errors."""
    import torch

    from gates.models import load_model

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
@click.option("--backend", "-b", required=True, help="Backend under test: a registry name, oracle, control, MODULE:FUNCTION, or hf:IMPL (stock transformers).")
@click.option("--reference", "-r", default="oracle", show_default=True, help="Reference, same forms as --backend.")
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DATA, show_default=True,
              help="Folder with GSM8k {split}.jsonl (question/answer).")
@click.option("--split", default="test", show_default=True)
@click.option("--limit", "-n", default=64, show_default=True, help="Texts to score (the first N of the split).")
@click.option("--batch-size", default=8, show_default=True)
@click.option("--padding", type=click.Choice(["left", "right"]), default="left", show_default=True)
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
    split: str, limit: int, batch_size: int, padding: str, page_size: int | None, seed: int, max_mean_kl: float | None,
    max_kl: float | None, min_top1: float | None, out_dir: Path | None, as_json: bool,
) -> None:
    """Teacher-forced logit gate on GSM8k answers: KL, top-1 agreement; exit 1 if it fails."""
    import dataclasses

    from gates.data import read_gsm8k
    from gates.logits import THRESHOLDS, gsm8k_texts, run_logit_gate, write_result
    from gates.swap import SwapError

    try:
        texts = gsm8k_texts(read_gsm8k(data_dir, split=split, limit=limit))
    except (OSError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    loaded = load_for_gate(model_path, gguf_file, dtype, device)
    model_dtype = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")
    overrides = {k: v for k, v in (("mean_kl", max_mean_kl), ("max_kl", max_kl), ("min_top1", min_top1)) if v is not None}
    thresholds = dataclasses.replace(THRESHOLDS[model_dtype], **overrides)
    click.echo(f"logit gate: {backend} vs {reference} on {loaded.source} ({model_dtype}), {len(texts)} texts", err=True)
    try:
        with click.progressbar(length=len(texts), label="scoring", file=sys.stderr) as bar:
            result = run_logit_gate(
                loaded.model, loaded.tokenizer, texts, backend=backend, reference=reference, batch_size=batch_size,
                padding_side=padding, page_size=page_size, seed=seed, thresholds=thresholds,
                model_name=loaded.source, progress=bar.update,
            )
    except (SwapError, KeyError, ValueError, ImportError) as exc:
        raise click.UsageError(str(exc).strip("'\"")) from None
    if out_dir is not None:
        write_result(result, out_dir)
    click.echo(json.dumps(result.to_json(), indent=1) if as_json else result.to_markdown())
    if not result.passed:
        sys.exit(1)
