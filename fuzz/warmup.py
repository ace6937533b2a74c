"""``pa-oracle warmup``: build, before a campaign, the kernel variants (compile keys) it will draw from.

A FlashInfer backend builds each of its modules with its own ninja run (``backends.flashinfer.build_modules``,
``MAX_JOBS`` compiler jobs side by side) into its JIT cache, where a later campaign finds them free;
another adapter compiles by judging one case drawn inside each key (Triton and inductor keep what
they compiled in ``TRITON_CACHE_DIR`` / ``TORCHINDUCTOR_CACHE_DIR``, which makes the campaign's own
compile of that key cheap). The keys are those ``pa_oracle.fuzz.campaign.variants.plan_variants``
chooses for ``--seed`` and ``--only`` (pass the campaign's own: ``--only head_dims=256,512`` builds the
wide heads, which the default draws leave out).
"""

from __future__ import annotations

import time

import click
from hypothesis import HealthCheck, Phase, given, seed, settings
from pa_oracle.backends import resolve
from pa_oracle.backends.base import Backend, CompileKey
from pa_oracle.fuzz.campaign.variants import key_label, plan_variants
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import Case


def one_case(backend: Backend, key: CompileKey, limits: Limits, at: int) -> Case:
    """A small case inside ``key`` (drawn, so it is one the campaign could draw)."""
    found: list[Case] = []

    @seed(at)
    @settings(max_examples=1, database=None, deadline=None, phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(cases(backend.capabilities, limits, variants=[key]))
    def take(case: Case) -> None:
        found.append(case)

    take()
    return found[0]


def warm_backend(backend: Backend, count: int, at: int, limits: Limits, echo=click.echo) -> list[CompileKey]:  # type: ignore[no-untyped-def]
    """Build ``count`` variants of ``backend`` (those a campaign with seed ``at`` picks); the keys built."""
    plan = plan_variants(backend, limits, budget=count * backend.compile_seconds, seed=at)
    if plan is None:
        echo(f"{backend.name}: nothing compiles per case")
        return []
    echo(f"{backend.name}: {len(plan.free)} of {plan.space} variants already built; building {len(plan.chosen)}")
    start = time.monotonic()
    if backend.build_shared():  # what every key loads (FlashInfer cascade's merge module)
        echo(f"  built {backend.name}'s shared modules in {time.monotonic() - start:.1f}s")
    built = backend.build_variants(plan.chosen)
    if built is None:  # no ahead-of-time build: one judged case per key compiles it
        built = []
        for key in plan.chosen:
            began = time.monotonic()
            outcome = check_case(backend, one_case(backend, key, limits, at))
            took = time.monotonic() - began
            if outcome.status in ("error", "crash"):
                why = outcome.message.splitlines()[0][:200] if outcome.message else ""
                echo(f"  {key_label(key)}: not built in {took:.1f}s ({outcome.status}: {why})")
            else:  # the verdict of the case judged to compile it is no campaign's: a campaign judges and reports
                echo(f"  {key_label(key)}: built in {took:.1f}s (its case judged {outcome.status}; a campaign reports verdicts)")
                built.append(key)
    echo(f"{backend.name}: built {len(built)} of {len(plan.chosen)} in {time.monotonic() - start:.1f}s")
    return built


@click.command()
@click.option("--backend", "-b", "backend_names", multiple=True, required=True, help="Backend name (repeatable).")
@click.option("--variants", "count", type=click.IntRange(min=1), default=4, show_default=True, help="Variants to build per backend.")
@click.option("--seed", default=0, show_default=True, help="The campaign seed whose variants to build.")
@click.option("--only", multiple=True, help="Narrow what is drawn, as for fuzz (give the campaign's own), e.g. head_dims=256,512.")
def warmup(backend_names: tuple[str, ...], count: int, seed: int, only: tuple[str, ...]) -> None:
    """Build the kernel variants a campaign will draw from (FlashInfer: in parallel, MAX_JOBS jobs)."""
    from pa_oracle.fuzz.cli import narrow

    for backend in (narrow(b, only) for b in resolve(backend_names, ())):
        why = backend.unavailable_reason()
        if why:
            click.echo(f"{backend.name}: unavailable ({why})", err=True)
            continue
        warm_backend(backend, count, seed, Limits())
