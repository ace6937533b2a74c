"""Cases per second of a fuzz campaign with warm kernels, and where the time goes (a benchmark).

    python benchmarks/fuzz_rate.py -b sdpa-math             # CPU
    python benchmarks/fuzz_rate.py -b flashinfer-decode -b flash-attn-kvcache-paged -n 100

Draws ``-n`` cases per backend from the campaign's own strategy (fixed seed; for an adapter that
compiles per variant, inside the variants a campaign with ``--compile-budget`` would use: the
prebuilt/cached ones and as many more as the budget pays for, default 0: at least one), runs each
once to warm (compile) the kernel variants, then times a second pass of ``check_case``: the whole judge
(tensors, kernel, float64 oracle, two controls, comparison) and, separately, the kernel call
alone on the same cases. Prints cases/s and the kernel's share of the time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from hypothesis import HealthCheck, given, seed, settings
from pa_oracle.backends import get_backend
from pa_oracle.backends.base import Backend
from pa_oracle.fuzz.campaign.variants import plan_variants
from pa_oracle.fuzz.cli import narrow
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import make_tensors


def draw_cases(backend: Backend, count: int, base_seed: int, compile_budget: float | None = 0.0) -> list[Case]:
    drawn: list[Case] = []
    plan = None if compile_budget is None else plan_variants(backend, Limits(), budget=compile_budget, seed=base_seed)
    strategy = cases(backend.capabilities, Limits()) if plan is None else plan.strategy(Limits())

    @seed(base_seed)
    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(case: Case) -> None:
        drawn.append(case)

    collect()
    return drawn[:count]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(backend: Backend, drawn: list[Case], profile: int = 0) -> tuple[float, float, int]:
    """(judge seconds, kernel-only seconds, cases judged) over ``drawn``, kernels already warm.

    With ``profile`` > 0, prints the top ``profile`` functions (cumulative time) of the timed judge pass."""
    device = backend.device or "cpu"
    supported = [case for case in drawn if backend.unsupported_reason(case) is None]
    for case in supported:  # warm-up: compiles every variant the cases need
        check_case(backend, case)
    sync(device)
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    for case in supported:
        check_case(backend, case)
    sync(device)
    judge = time.perf_counter() - start
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(profile)
    inputs = [(backend.plan(case), make_tensors(case, device)) for case in supported]
    sync(device)
    start = time.perf_counter()
    for plan, tensors in inputs:
        backend.run(plan, tensors)
    sync(device)
    return judge, time.perf_counter() - start, len(supported)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-b", "--backend", action="append", required=True)
    parser.add_argument("-n", "--examples", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", default=[], help="narrow the draws, as for pa-oracle fuzz")
    parser.add_argument("--compile-budget", type=float, default=0.0,
                        help="seconds of compiles the drawn variants may cost (default 0: the built ones, at least one); -1: no restriction")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest functions of the judge pass")
    args = parser.parse_args()
    for name in args.backend:
        backend = narrow(get_backend(name), tuple(args.only))
        if backend.unavailable_reason():
            print(f"{name}: unavailable ({backend.unavailable_reason()})")
            continue
        budget = None if args.compile_budget < 0 else args.compile_budget
        judge, kernel, judged = measure(backend, draw_cases(backend, args.examples, args.seed, budget), args.profile)
        print(
            f"{name} on {backend.device}: {judged} cases, {judged / judge:.1f} cases/s warm "
            f"({judge / judged * 1e3:.1f} ms a case); kernel calls alone {kernel / judged * 1e3:.2f} ms a case "
            f"-> the kernel is {kernel / judge:.1%} of the time, the oracle and checks the rest",
            flush=True,
        )


if __name__ == "__main__":
    main()
