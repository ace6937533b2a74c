"""``pa-oracle warmup``: build, before a campaign or a replay, the kernel variants (compile keys) it will run on.

The builds are the run's own (``pa_oracle.fuzz.campaign.compile_plan``): every backend's keys together, in
build processes, FlashInfer's modules side by side (``MAX_JOBS`` compiler jobs shared), Triton and flex
keys warmed up by judging one drawn case each beside them; they land in ``PA_ORACLE_CACHE_DIR``, where a
later campaign, replay or triage finds them built. With ``-b``, the keys are those a campaign with
``--seed`` and ``--only`` plans first (pass the campaign's own: ``--only head_dims=256,512`` builds the wide
heads, which the default draws leave out); with ``--corpus``, every key the corpus's cases run on.
"""

from __future__ import annotations

import math
from pathlib import Path

import click
from pa_oracle.backends import available, resolve
from pa_oracle.fuzz.campaign.compile_plan import CompilePlan, build_everything, corpus_plan
from pa_oracle.fuzz.draw.strategies import Limits
from pa_oracle.fuzz.run.isolation import isolatable


@click.command()
@click.option("--backend", "-b", "backend_names", multiple=True,
              help="Backend name (repeatable). Default with --corpus: every available one.")
@click.option("--variants", "count", type=click.IntRange(min=1), default=4, show_default=True, help="Variants to build per backend.")
@click.option("--seed", default=0, show_default=True, help="The campaign seed whose variants to build.")
@click.option("--only", multiple=True, help="Narrow what is drawn, as for fuzz (give the campaign's own), e.g. head_dims=256,512.")
@click.option("--corpus", "corpus", type=click.Path(exists=True, path_type=Path), multiple=True,
              help="Build every variant these case files (or folders, e.g. golden/cases) run on, instead of a campaign's.")
def warmup(backend_names: tuple[str, ...], count: int, seed: int, only: tuple[str, ...], corpus: tuple[Path, ...]) -> None:
    """Build the kernel variants a campaign (or a corpus replay) will run on, all together (FlashInfer: MAX_JOBS jobs)."""
    from pa_oracle.fuzz.campaign.replay import corpus_files, corpus_kinds
    from pa_oracle.fuzz.cli import narrow
    from pa_oracle.oracle.tensors import load_case

    if not backend_names and not corpus:
        raise click.UsageError("give --backend (a campaign's variants) or --corpus (a corpus's)")
    backends = [narrow(b, only) for b in resolve(backend_names, ())] if backend_names else available()[0]
    ready = []
    for backend in backends:
        why = backend.unavailable_reason()
        if why:
            click.echo(f"{backend.name}: unavailable ({why})", err=True)
        else:
            ready.append(backend)
    if corpus:
        kinds = corpus_kinds(corpus_files(corpus))
        for path in kinds.get("write", []):
            click.echo(f"{path}: a write case: nothing to build ahead (a write kernel compiles on its first case)", err=True)
        plan = corpus_plan([load_case(path) for path in kinds.get("attention", [])], ready)
    else:
        plan = CompilePlan.make(ready, Limits(), budget=math.inf, seed=seed, per_backend=count)
    for backend in ready:
        if plan.plan_for(backend) is None:
            click.echo(f"{backend.name}: nothing compiles per case" if not backend.compile_fields else
                       f"{backend.name}: nothing to build")
    seconds = build_everything(plan, isolatable, click.echo)
    for line in plan.lines():
        click.echo(line)
    click.echo(f"built in {seconds:.1f}s (PA_ORACLE_CACHE_DIR keeps them)")
