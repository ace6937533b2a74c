"""One compile plan per command: the variants every backend of a run draws from, chosen before judging and built together.

Verification model: for each backend whose cases compile per key (``Backend.compile_fields``), the keys
already built (prebuilt AOT, in the library's cache: ``free``) are usable at once; up to ``MAX_KEYS``
others per backend (rotating with the seed, as ``variants`` orders them) are planned in rounds, one key per
backend a round (backends with no free key first, the cheapest first), while the estimated wall time of building all of them
together (``estimated_wall``: ``parallel`` side by side) stays within the compile budget. A key the budget
leaves out is *refused* (with its estimate); a backend left with no usable key at all is *left out*
(``left_out``: the reason names its cheapest key and what it would take). The planned keys are built by
``Builds`` while the backends with ready keys judge; a key is drawn only once built, so no case compiles
in a worker, and a backend whose keys are still building waits its turn (``pa_oracle.fuzz.campaign.engine``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pa_oracle.backends.base import Backend, CompileKey
from pa_oracle.fuzz.campaign.builds import SHARED, Build, Builds, BuildTask, parallel_builds
from pa_oracle.fuzz.campaign.variants import PROBED_SPARES, REFUSED, VariantPlan, all_known, candidates, key_label
from pa_oracle.fuzz.draw.strategies import Limits
from pa_oracle.oracle.case import Case

MAX_KEYS = 4  # keys built per backend in one run; consecutive seeds take the next ones
Known = Callable[[Backend], Callable[[Case], bool] | None]  # a backend's known-finding test (the ledger), or None


def estimated_wall(costs: list[float], parallel: int) -> float:
    """Seconds to build keys of these ``costs`` (each as measured alone) ``parallel`` side by side."""
    return max(max(costs, default=0.0), sum(costs) / max(parallel, 1))


@dataclass
class CompilePlan:
    """The run's variant plans (backend name -> ``VariantPlan``), what the budget left out, and its builds."""

    plans: dict[str, VariantPlan]
    left_out: dict[str, str]
    budget: float
    parallel: int
    builds: Builds | None = None
    _tasks: dict[int, tuple[VariantPlan, CompileKey]] = field(default_factory=dict, repr=False)

    @classmethod
    def make(cls, backends: list[Backend], limits: Limits, *, budget: float, seed: int, known: Known | None = None,
             parallel: int | None = None, per_backend: int = MAX_KEYS) -> CompilePlan:
        """Plan every backend of ``backends`` (see the module docstring), at most ``per_backend`` keys each;
        nothing is built yet (``start``)."""
        parallel = parallel or parallel_builds()
        plans: dict[str, VariantPlan] = {}
        orders: dict[str, list[CompileKey]] = {}
        for backend in backends:
            found = candidates(backend, limits)
            if found is None or backend.name in plans:
                continue
            keys, free, unbuilt = found
            test = known(backend) if known is not None else None
            order = _rotated(unbuilt, seed, per_backend)
            if test is not None:  # a key whose probe cases are all known findings would judge nothing
                free = {k: why for k, why in free.items() if not all_known(backend, limits, k, test)} or free
                live = [k for k in order[: per_backend + PROBED_SPARES] if not all_known(backend, limits, k, test)]
                order = live or order
            plans[backend.name] = VariantPlan(backend, len(keys), free, [], budget, inline=False)
            orders[backend.name] = order[:per_backend]
        costs: list[float] = []
        # those with nothing built choose first, the cheapest first: as many backends as possible get a key
        names = sorted(plans, key=lambda name: (bool(plans[name].free), plans[name].backend.compile_seconds))
        for turn in range(per_backend):
            added = False
            for name in names:
                plan, order = plans[name], orders[name]
                if turn >= len(order):
                    continue
                cost = plan.backend.compile_seconds
                if estimated_wall([*costs, cost], parallel) <= budget:
                    plan.chosen.append(order[turn])
                    costs.append(cost)
                    added = True
                else:
                    plan.refused[order[turn]] = cost
            if not added:
                break
        for name in names:  # what a turn that added nothing did not try is refused too
            plan = plans[name]
            for key in orders[name]:
                if key not in plan.chosen:
                    plan.refused.setdefault(key, plan.backend.compile_seconds)
        left_out = {name: _why_left_out(plan, budget) for name, plan in plans.items() if not plan.free and not plan.chosen}
        return cls({n: p for n, p in plans.items() if n not in left_out}, left_out, budget, parallel)

    def plan_for(self, backend: Backend) -> VariantPlan | None:
        return self.plans.get(backend.name)

    def tasks(self, limits: Limits, seed: int, spec_of: Callable[[Backend], str | None]) -> list[BuildTask]:
        """One ``BuildTask`` per planned key (``spec_of``: how a build process loads the backend; a backend it
        cannot load compiles on its first cases, within the budget, as before)."""
        tasks: list[BuildTask] = []
        self._tasks = {}
        for plan in self.plans.values():
            spec = spec_of(plan.backend)
            if spec is None:
                plan.inline = True
                continue
            ahead = type(plan.backend).build_variants is not Backend.build_variants
            shared = [SHARED] if type(plan.backend).build_shared is not Backend.build_shared else []
            for key in [*shared, *plan.chosen]:
                task = BuildTask(len(tasks), plan.backend.name, spec, plan.backend.capabilities, key, limits, ahead, seed)
                self._tasks[task.index] = (plan, key)
                tasks.append(task)
        return tasks

    def start(self, tasks: list[BuildTask], progress: Callable[[str], None] | None = None) -> None:
        """Build ``tasks`` in the background (``Builds``), saying what is built and what is left out."""
        say = progress or (lambda line: None)
        for name, why in self.left_out.items():
            say(f"left out {name}: {why}")
        for plan in self.plans.values():
            say(_plan_line(plan))
        if not tasks:
            return
        backends = len({t.backend for t in tasks})
        keyed = [t for t in tasks if t.key != SHARED]
        say(f"building {len(keyed)} variants of {backends} backends in the background "
            f"(~{estimated_wall([self.plans[t.backend].backend.compile_seconds for t in keyed], self.parallel):.0f}s "
            f"estimated, {self.parallel} side by side)")

        def built(build: Build) -> None:
            plan, key = self._tasks[build.task.index]
            if key == SHARED:
                say(f"  built {plan.backend.name}'s shared modules in {build.seconds:.1f}s" if build.error is None else
                    f"  building {plan.backend.name}'s shared modules failed: {build.error}")
            elif build.error is not None:
                plan.failed[key] = build.error
                say(f"  build of {plan.backend.name} {key_label(key)} failed after {build.seconds:.1f}s: {build.error}")
            elif not build.warmed:
                plan.compiled[key] = build.seconds
                say(f"  built {plan.backend.name} {key_label(key)} in {build.seconds:.1f}s")
            else:
                plan.warmed[key] = build.seconds
                say(f"  warmed {plan.backend.name} {key_label(key)} in {build.seconds:.1f}s")

        self.builds = Builds(tasks, built, parallel=self.parallel)
        self.builds.start()

    def building(self, backend: Backend) -> bool:
        """Whether keys of ``backend`` are still being built."""
        if self.builds is None:
            return False
        return any(t.backend == backend.name and t.key != SHARED for t in self.builds.pending)

    def waiting(self, backend: Backend) -> bool:
        """Whether ``backend`` has no usable key yet, but builds that may give it one."""
        plan = self.plans.get(backend.name)
        return plan is not None and not plan.ready() and self.building(backend)

    def not_built(self, backend: Backend) -> str | None:
        """Why ``backend`` can judge nothing (no usable key, none building), or None."""
        plan = self.plans.get(backend.name)
        if plan is None or plan.ready() or self.building(backend):
            return None
        failed = "; ".join(f"{key_label(k)}: {why[:160]}" for k, why in plan.failed.items())
        return f"no variant of {backend.name} could be built in this run" + (f" ({failed})" if failed else "")

    def wait(self, backend: Backend, until: float | None) -> float:
        """Wait for the builds until ``backend`` has a usable key, none of its keys is building, or ``until``
        (monotonic); the seconds waited."""
        start = time.monotonic()
        while self.builds is not None and self.waiting(backend):
            left = 1.0 if until is None else min(until - time.monotonic(), 1.0)
            if left <= 0:
                break
            self.builds.wait(left)
        return time.monotonic() - start

    def close(self) -> None:
        """Stop the builds still running (their keys stay unbuilt; the plan lines say so)."""
        if self.builds is not None:
            self.builds.close()

    def lines(self) -> list[str]:
        """The summary: every backend's plan line and every backend left out."""
        lines = [plan.plan_line() for plan in self.plans.values()]
        lines += [f"left out {name}: {why}" for name, why in self.left_out.items()]
        return lines


def _rotated(keys: list[CompileKey], seed: int, per_backend: int) -> list[CompileKey]:
    """``keys`` starting at the slice of ``seed`` (consecutive seeds: consecutive slices of ``per_backend``)."""
    if not keys:
        return []
    start = (seed * per_backend) % len(keys)
    return keys[start:] + keys[:start]


def _why_left_out(plan: VariantPlan, budget: float) -> str:
    cheapest = min(plan.refused.items(), key=lambda item: item[1], default=None)
    if cheapest is None:
        return "no variant it can run"
    key, seconds = cheapest
    why = (f"more than this run's compile budget ({budget:.0f}s)" if seconds > budget else
           f"and this run's compile budget ({budget:.0f}s) went to the builds of backends that cost less")
    return (f"none of its {plan.space} variants is built here, and building one ({key_label(key)}) takes ~{seconds:.0f}s, "
            f"{why}: give --compile-budget {seconds:.0f} or more, or run `pa-oracle warmup -b {plan.backend.name}` first "
            f"(PA_ORACLE_CACHE_DIR keeps what it builds)")


def _plan_line(plan: VariantPlan) -> str:
    free = list(plan.free.values())
    prebuilt = free.count("prebuilt")
    head = (f"{plan.backend.name}: {prebuilt} prebuilt and {len(free) - prebuilt} cached of {plan.space} variants; "
            f"building {len(plan.chosen)}")
    if plan.refused:
        head += f", {len(plan.refused)} refused by the budget (~{max(plan.refused.values()):.0f}s each)"
    return head


def corpus_plan(cases: list[Case], backends: list[Backend]) -> CompilePlan:
    """A plan building every variant that ``cases`` (a corpus, a triaged case) run on, on each of ``backends``
    that supports them, with no budget: replay and triage build them all together before judging."""
    plans: dict[str, VariantPlan] = {}
    for backend in backends:
        if not backend.compile_fields or backend.name in plans or type(backend).build_variants is Backend.build_variants:
            continue  # (a key with no ahead-of-time build compiles on its first case: warming it first would only wait)
        keys: list[CompileKey] = []
        for case in cases:
            try:
                if backend.unsupported_reason(case) is not None:
                    continue
                key = backend.compile_key(case)
            except Exception:  # noqa: BLE001 - a case the adapter cannot key is judged (and reported) as it is
                continue
            if key not in keys:
                keys.append(key)
        reasons = {k: backend.built_reason(k) for k in keys}
        keys = [k for k in keys if not (reasons[k] or "").startswith(REFUSED)]
        free = {k: why for k in keys if (why := reasons[k]) is not None}
        plans[backend.name] = VariantPlan(backend, len(keys), free, [k for k in keys if k not in free], math.inf,
                                          inline=False)
    return CompilePlan(plans, {}, math.inf, parallel_builds())


def build_everything(plan: CompilePlan, spec_of: Callable[[Backend], str | None], progress: Callable[[str], None]) -> float:
    """Build every planned key of ``plan`` together and wait for them (``progress`` says each); the seconds taken."""
    start = time.monotonic()
    plan.start(plan.tasks(Limits(), 0, spec_of), progress)
    try:
        while plan.builds is not None and plan.builds.pending:
            plan.builds.wait(5.0)
    finally:
        plan.close()
    return time.monotonic() - start
