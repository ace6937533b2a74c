"""A campaign's compile budget: which compiled kernel variants (compile keys) a backend's cases run on.

Verification model: a key is *free* when the adapter says it needs no compile (prebuilt AOT, in the
library's cache, nothing compiles); a few other keys are *chosen* to be built this run, rotating
with the seed (consecutive seeds take consecutive slices of one fixed shuffle, so campaigns cover
new variants until every one was built). Cases are then drawn inside the usable keys
(``pa_oracle.fuzz.draw.strategies.cases(..., variants=)``); a chosen key's first case pays its
compile, and once the budget is spent only keys already built stay usable. Nothing outside the
compile key (layouts, lengths, page tables, data, seeds) is restricted.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from dataclasses import dataclass, field
from collections.abc import Callable

from hypothesis import strategies as st
from pa_oracle.backends.base import Backend, CompileKey
from pa_oracle.fuzz.draw.determinism import seed_only_draws
from pa_oracle.fuzz.draw.strategies import Limits, cases, field_values, variant_keys
from pa_oracle.oracle.case import Case

COMPILE_SHARE = 0.3  # default compile budget: this share of --time-budget
REFUSED = "refused"  # a ``built_reason`` starting so: the adapter refuses every case of that key before a plan


def key_label(key: CompileKey) -> str:
    """>>> key_label((("q_dtype", "bfloat16"), ("head_dim_qk", 128), ("window", True)))
    'bfloat16 hd128 window'"""
    parts = []
    for name, value in key:
        if isinstance(value, bool):
            if value:
                parts.append(name)
        elif name == "head_dim_qk":
            parts.append(f"hd{value}")
        elif name == "head_dim_vo":
            parts.append(f"vo{value}")
        elif name == "num_kv_heads":
            parts.append(f"kv{value}")
        elif name == "group_size":
            parts.append(f"g{value}")
        elif name == "window_left":
            parts.append(f"window{value}" if value >= 0 else "")
        elif name == "logits_soft_cap":
            parts.append(f"cap{value:g}" if value else "")
        else:
            parts.append(str(value))
    return " ".join(p for p in parts if p) or "(one variant)"


def steer(keys: list[CompileKey], allowed: Callable[[CompileKey], bool], key: CompileKey) -> CompileKey:
    """``key`` if allowed, else the next allowed key of ``keys`` (wrapping; ``key`` itself if none)."""
    start = keys.index(key)
    return next((k for k in keys[start:] + keys[:start] if allowed(k)), key)


@dataclass(frozen=True)
class Steering:
    """A variant plan's keys and the ones allowed at one moment (what a helper draws inside)."""

    keys: tuple[CompileKey, ...]
    allowed: frozenset[CompileKey]

    def redirect(self, key: CompileKey) -> CompileKey:
        return steer(list(self.keys), self.allowed.__contains__, key)


@dataclass
class VariantPlan:
    """The keys one backend's cases are drawn from in this run, and what they cost."""

    backend: Backend
    space: int  # compile keys the strategies can reach for this backend
    free: dict[CompileKey, str]  # key -> why it needs no compile ("prebuilt", "cached", ...)
    chosen: list[CompileKey]  # keys to build in this run, in build order
    budget: float  # seconds of compiling this run may spend
    spent: float = 0.0
    ran: dict[CompileKey, int] = field(default_factory=dict)  # cases judged per key
    compiled: dict[CompileKey, float] = field(default_factory=dict)  # key -> seconds its first case (or build) took
    warm: list[float] = field(default_factory=list)  # seconds of the cases that compiled nothing
    announce: Callable[[str], None] | None = field(default=None, repr=False)  # a progress line before a compile
    inline: bool = True  # False: a run's builds (``compile_plan``) build ``chosen``; a key is usable once built there
    warmed: dict[CompileKey, float] = field(default_factory=dict)  # key -> seconds a warm-up case took (caches filled)
    failed: dict[CompileKey, str] = field(default_factory=dict)  # key -> why its build failed
    refused: dict[CompileKey, float] = field(default_factory=dict)  # keys the budget left out -> estimated seconds
    _slow_before: float = field(default=0.0, repr=False)  # seconds of the case before if it counted as compiling
    _paced: bool = field(default=False, repr=False)  # the first PACE_CASES warm cases were looked at again
    _announced: set[CompileKey] = field(default_factory=set, repr=False)  # keys whose compile was announced

    @property
    def keys(self) -> list[CompileKey]:
        return list(self.free) + self.chosen

    def allowed(self, key: CompileKey) -> bool:
        """Whether a case may be drawn inside ``key`` now: free, built (or warmed) this run, or (compiling on a
        first case) budget is left."""
        return key in self.free or key in self.compiled or key in self.warmed or (self.inline and self.spent < self.budget)

    def ready(self) -> bool:
        """Whether some key is usable now (a plan whose keys are still building is not)."""
        return any(self.allowed(k) for k in self.keys)

    def usable(self) -> list[CompileKey]:
        """The keys the next case may be drawn from (never empty)."""
        return [k for k in self.keys if self.allowed(k)] or self.chosen[:1]

    def redirect(self, key: CompileKey) -> CompileKey:
        """``key`` if allowed, else the next allowed key of ``keys`` (wrapping). A key once allowed and run
        stays allowed, so Hypothesis replaying a failing draw gets the same case."""
        return steer(self.keys, self.allowed, key)

    def steering(self) -> Steering:
        """The keys and those allowed now, frozen (a draw process steers with it as this plan does now)."""
        return Steering(tuple(self.keys), frozenset(k for k in self.keys if self.allowed(k)))

    def strategy(self, limits: Limits) -> st.SearchStrategy[Case]:
        """Cases inside the plan's keys: one drawn from all of them (a fixed list, so draws replay), then
        steered to an allowed one (the allowed set shrinks once the budget is spent)."""
        return cases(self.backend.capabilities, limits, variants=self.keys, redirect=self.redirect)

    def before(self, case: Case) -> None:
        """A case is about to be judged: say so through ``announce`` when its key is not built yet
        (its first case compiles), e.g. "compiling flashinfer-decode bfloat16 hd128 window ..."."""
        key = self.backend.compile_key(case)
        if self.announce is not None and key not in self.free and key not in self.compiled and key not in self._announced:
            self._announced.add(key)  # cases queued behind the first of a key would say it again
            self.announce(f"  compiling {self.backend.name} {key_label(key)} (its first case) ...")

    def observe(self, case: Case, seconds: float) -> float:
        """A case of this backend took ``seconds`` (kernel, oracle, checks): the first case of a key that
        was not free paid its compile, and a case far slower than the warm ones (``_slow``) compiled what its
        key does not name. Returns the seconds counted as compiling now (0.0 for a warm case)."""
        key = self.backend.compile_key(case)
        self.ran[key] = self.ran.get(key, 0) + 1
        if key not in self.free and key not in self.compiled:
            self.compiled[key] = seconds
            return self._compiling(seconds)
        if self.warm and seconds > _slow(self.warm[-20:]):
            return self._compiling(seconds)  # a compile the key does not name (e.g. a padded length): counted all the same
        self.warm.append(seconds)
        self._slow_before = 0.0
        if len(self.warm) < PACE_CASES or self._paced:
            return 0.0
        # the pace is known now: a first case far slower than it (and not the warm-up of a process) compiled what no
        # key names (FlashInfer's cascade merge module on a prebuilt key's first case: 8.8 s on the H200)
        self._paced = True
        bound = max(_slow(self.warm), EARLY_COMPILE)
        counted = sum(self._compiling(s) if s > bound else self._warm_again() for s in self.warm)
        self.warm = [s for s in self.warm if s <= bound]
        return counted

    def _compiling(self, seconds: float) -> float:
        """Count a case that compiled. A case judged beside a compiling one (two side by side on an accelerator)
        waited for it: only what it took past the case before it counts (the H200's two cases waiting on
        cascade's compile summed to 19.3 s of a 10.0 s chunk)."""
        counted = max(seconds - self._slow_before, 0.0)
        self._slow_before = seconds
        self.spent += counted
        return counted

    def _warm_again(self) -> float:
        self._slow_before = 0.0
        return 0.0

    def lines(self) -> list[str]:
        """What the coverage table says about variants: which ran this time, which were never built."""
        ran = sorted(self.ran, key=lambda k: -self.ran[k])
        how = {k: self.free.get(k) or ("compiled" if k in self.compiled else "?") for k in ran}
        shown = "; ".join(f"{key_label(k)} [{how[k]}] {self.ran[k]}" for k in ran[:8])
        more = f"; +{len(ran) - 8} more" if len(ran) > 8 else ""
        unbuilt = self.space - len(self.free) - len(self.compiled)
        lines = [
            f"  {self.backend.name} variants: {len(ran)} ran this time ({shown}{more}); compiled {len(self.compiled)} "
            f"in {self.spent:.1f}s of a {self.budget:.0f}s budget; "
            f"{unbuilt} of {self.space} never built",
        ]
        if not self.inline:
            lines.append("  " + self.plan_line())
        return lines

    def plan_line(self) -> str:
        """What the run's compile plan did for this backend: planned, built, prebuilt/cached, refused."""
        free = list(self.free.values())
        built = [k for k in self.chosen if k in self.compiled or k in self.warmed]
        unfinished = [k for k in self.chosen if k not in built and k not in self.failed]
        text = (f"{self.backend.name} compile plan: {len(self.chosen)} planned, {len(built)} built, "
                f"{free.count('prebuilt')} prebuilt, {len(free) - free.count('prebuilt')} cached, "
                f"{len(self.refused)} refused by the budget")
        if self.failed:
            text += "; failed: " + "; ".join(f"{key_label(k)} ({why[:120]})" for k, why in list(self.failed.items())[:3])
        if unfinished:
            text += "; not finished in the run: " + ", ".join(key_label(k) for k in unfinished[:4])
        return text


def plan_variants(
    backend: Backend, limits: Limits, *, budget: float, seed: int, compile_seconds: float | None = None,
    known: Callable[[Case], bool] | None = None,
) -> VariantPlan | None:
    """The keys ``backend`` draws from under a compile ``budget`` (seconds); None when nothing about it
    compiles per case (its draws stay exactly those of an unrestricted campaign). With ``known`` (a case
    the campaign skips as a known finding), a key whose probe draws are all known is passed over for
    the next one: every case of it would be skipped, and a plan of such keys judges nothing."""
    found = candidates(backend, limits)
    if found is None:
        return None
    keys, free, unbuilt = found
    cost = compile_seconds or backend.compile_seconds
    count = min(len(unbuilt), int(budget // cost) if cost > 0 else len(unbuilt))
    if not free and unbuilt:
        count = max(count, 1)  # something must run
    start = (seed * max(count, 1)) % max(len(unbuilt), 1)
    order = [unbuilt[(start + i) % len(unbuilt)] for i in range(min(len(unbuilt), count + PROBED_SPARES))]
    if known is None:
        chosen = order[:count]
    else:
        free = {k: why for k, why in free.items() if not all_known(backend, limits, k, known)} or free
        live = (k for k in order[: count + PROBED_SPARES] if not all_known(backend, limits, k, known))
        chosen = list(itertools.islice(live, count)) or order[:count]
    return VariantPlan(backend, len(keys), free, chosen, budget)


def candidates(backend: Backend, limits: Limits) -> tuple[list[CompileKey], dict[CompileKey, str], list[CompileKey]] | None:
    """(every key a case of ``backend`` can run on, those free with why, the others in one fixed order per
    backend); None when nothing about it compiles per case. Keys the adapter refuses are left out."""
    fields = backend.compile_fields
    if not fields:
        return None
    reasons = {k: backend.built_reason(k) for k in variant_keys(backend.capabilities, limits, fields)}
    keys = [k for k, why in reasons.items() if not (why or "").startswith(REFUSED)]  # no case of them runs
    free = {k: why for k in keys if (why := reasons[k]) is not None}
    unbuilt = [k for k in keys if k not in free]
    _shuffle(unbuilt, backend, limits)  # one fixed order per backend
    return keys, free, unbuilt


PACE_CASES = 5  # warm cases that set the pace a first slow case is told from
EARLY_COMPILE = 2.0  # seconds a first case must take past its pace to count as compiling (starting CUDA takes ~1 s)


def _slow(warm: list[float]) -> float:
    """Seconds past which a case of a built key compiled something: well above the warm cases' median."""
    return 4 * statistics.median(warm) + 0.5


PROBED_SPARES = 16  # keys past the budget's count tried in place of all-known ones
PROBE_DRAWS = 8  # cases drawn inside a key to see whether the ledger skips every one


def all_known(backend: Backend, limits: Limits, key: CompileKey, known: Callable[[Case], bool]) -> bool:
    """Whether each of ``PROBE_DRAWS`` cases drawn inside ``key`` (a fixed seed) is a known finding."""
    with seed_only_draws():  # as the campaign draws: the same cases whatever modules are loaded
        drawn = draws_inside(backend, limits, key, PROBE_DRAWS, 0)
    return bool(drawn) and all(known(case) for case in drawn)


def draws_inside(backend: Backend, limits: Limits, key: CompileKey, count: int, at: int) -> list[Case]:
    """Up to ``count`` cases of ``backend`` drawn inside ``key`` with Hypothesis seed ``at`` (cases a campaign could draw)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed

    drawn: list[Case] = []

    @fixed_seed(at)
    @settings(max_examples=count, database=None, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(cases(backend.capabilities, limits, variants=[key]))
    def probe(case: Case) -> None:
        drawn.append(case)

    probe()
    return drawn


# fields whose key names an option's value (a Triton constexpr), and the value that means "off"
VALUE_FIELDS = {"window_left": -1, "logits_soft_cap": 0.0}


def _shuffle(keys: list[CompileKey], backend: Backend, limits: Limits) -> None:
    """Shuffle ``keys`` in place, the same way every run. Keys naming an option's value are weighted
    so that the option is off in half of the order, as the unrestricted strategies draw it, not in
    one key of 1 + (the number of values)."""
    rng = random.Random(f"variants:{backend.name}")
    valued = [f for f in backend.compile_fields if f in VALUE_FIELDS]
    if not valued:
        rng.shuffle(keys)  # as before value fields existed: the same order, so the same cases
        return
    on_values = {f: len(field_values(backend.capabilities, limits, f)) - 1 for f in valued}

    def weight(key: CompileKey) -> float:
        v = dict(key)
        return math.prod(0.5 if v[f] == VALUE_FIELDS[f] else 0.5 / on_values[f] for f in valued)

    scores = {key: rng.random() ** (1.0 / weight(key)) for key in keys}  # weighted order (Efraimidis-Spirakis)
    keys.sort(key=lambda key: -scores[key])


def compile_budget(time_budget: float | None, asked: float | None) -> float | None:
    """``--compile-budget`` if given, else ``COMPILE_SHARE`` of ``--time-budget``; None (no variant
    restriction) when neither is given."""
    if asked is not None:
        return asked
    return None if time_budget is None else COMPILE_SHARE * time_budget
