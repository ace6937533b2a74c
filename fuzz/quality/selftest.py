"""The suite's detection power: fuzz every planted-bug kernel (each must be found) and every
correct-but-differently-rounded kernel (none may be flagged), with a fixed seed and budget; one
progress line per kernel with the time it took and an estimate of the time left."""

from __future__ import annotations

import time
import types
from dataclasses import dataclass
from typing import Callable

from pa_oracle.backends.base import Backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.backends.writes import WriteBackend
from pa_oracle.fuzz.campaign.engine import CampaignConfig, Shared, fuzz_backend
from pa_oracle.fuzz.checks.append import WRITE
from pa_oracle.fuzz.checks.registry import ALL_CHECKS
from pa_oracle.fuzz.quality import (
    planted,
    planted_composed,
    planted_families,
    planted_layouts,
    planted_mla_fp8q,
    planted_mla_rope,
    planted_positions,
    planted_user,
    planted_writes,
)

# selftest asks "is it found?", not "how small": a finding's shrinking stops after this many seconds (the
# finding is kept as it is then). Unbounded, one planted bug shrank for over five minutes on a CPU and
# Hypothesis printed its "spent more than five minutes working to shrink ... PLEASE REPORT THIS".
SHRINK_SECONDS = 20.0


@dataclass(frozen=True)
class SelftestResult:
    kernel: str
    planted: bool  # True: a bug the suite must find; False: a correct kernel it must pass
    detected: bool
    examples: int
    message: str
    seconds: float = 0.0
    ran: bool = True  # False: --time-budget ran out before (or while) it ran: no verdict on it

    @property
    def ok(self) -> bool:
        return self.ran and self.detected == self.planted


# KV-cache write kernels (WriteKernel classes), judged by the write campaign: the same BUGS / PLANTED / CORRECT
_WRITE_BUGS = (*planted_writes.BUGS, *planted_writes.UPSTREAM_BUGS, *planted_writes.NEW_DRAW_BUGS)
WRITES = types.SimpleNamespace(
    __name__=planted_writes.__name__, BUGS=tuple(k.__name__ for k in _WRITE_BUGS), PLANTED=tuple(k.__name__ for k in _WRITE_BUGS),
    CORRECT=tuple(k.__name__ for k in planted_writes.CORRECT),
    **{k.__name__: k for k in (*_WRITE_BUGS, *planted_writes.CORRECT)})
# each: BUGS, PLANTED, CORRECT (user-kernel functions, or Backend classes), optional CHECKS (kernel -> check name)
MODULES = (planted, planted_families, planted_layouts, planted_layouts.STRIDED, planted_composed, planted_user, planted_positions,
           planted_mla_rope, planted_mla_fp8q, WRITES)


def selftest_kernels() -> list[tuple[object, str]]:
    """(module, name) of every kernel selftest runs, in the order it runs them."""
    return [(m, n) for m in MODULES for n in m.PLANTED + m.CORRECT]  # type: ignore[attr-defined]


def _is_bug(module: object, name: str) -> bool:
    return name in module.BUGS  # type: ignore[attr-defined]


def _fuzz_one(module: object, name: str, examples: int, seed: int, deadline: float | None,
              shrink_seconds: float) -> tuple[bool, int, str]:
    """(found, examples judged, the finding's first line) for one selftest kernel."""
    target = getattr(module, name)
    if module is WRITES:  # in-process, as the attention kernels below, through the engine's write check
        writer = target()
        writer.name = f"{module.__name__}:{name}"
        config = CampaignConfig(examples=examples, seed=seed, isolate=False, checks=(WRITE,), shrink_seconds=shrink_seconds)
        result = fuzz_backend(WriteBackend(writer, user=True), config, check=WRITE, shared=Shared(deadline=deadline))
        return bool(result.findings), result.examples, result.findings[-1].message if result.findings else ""
    kernel = target() if isinstance(target, type) and issubclass(target, Backend) else UserKernel(target, name=f"{module.__name__}:{name}")  # type: ignore[attr-defined]
    check = ALL_CHECKS[getattr(module, "CHECKS", {}).get(name, "oracle")]
    # in-process: the planted kernels are this project's own torch code (a worker each: ~3 s more per kernel)
    config = CampaignConfig(examples=examples, seed=seed, isolate=False, shrink_seconds=shrink_seconds)
    outcome = fuzz_backend(kernel, config, check=check, shared=Shared(deadline=deadline))
    return outcome.finding is not None, outcome.examples, outcome.finding.message.splitlines()[0] if outcome.finding else ""


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def run_selftest(
    *, examples: int = 200, correct_examples: int = 150, seed: int = 0, progress: Callable[[str], None] | None = None,
    time_budget: float | None = None, shrink_seconds: float = SHRINK_SECONDS,
) -> list[SelftestResult]:
    """Every kernel's result, in order. With ``time_budget`` (seconds) no kernel starts after it is spent and one
    still running is cut at it: those come back with ``ran=False``."""
    kernels = selftest_kernels()
    started = time.monotonic()
    deadline = started + time_budget if time_budget is not None else None
    results: list[SelftestResult] = []
    if progress:
        bugs = sum(_is_bug(module, name) for module, name in kernels)
        progress(f"selftest: {len(kernels)} kernels ({bugs} planted bugs, {len(kernels) - bugs} correct), "
                 f"up to {examples} examples per bug, {correct_examples} per correct kernel")
    for i, (module, name) in enumerate(kernels):
        is_bug = _is_bug(module, name)
        wanted = examples if is_bug else correct_examples
        if deadline is not None and time.monotonic() >= deadline:
            results.append(SelftestResult(name, is_bug, False, 0, "not run: --time-budget spent", ran=False))
            continue
        one = time.monotonic()
        found, judged, message = _fuzz_one(module, name, wanted, seed, deadline, shrink_seconds)
        seconds = time.monotonic() - one
        # the budget ended it before its examples (a finding cut while shrinking is kept: it was found)
        cut = not found and judged < wanted and deadline is not None and time.monotonic() >= deadline
        result = SelftestResult(name, is_bug, found, judged,
                                message if not cut else f"cut by --time-budget after {judged} examples",
                                round(seconds, 2), ran=not cut)
        results.append(result)
        if progress:
            elapsed = time.monotonic() - started
            left = len(kernels) - i - 1
            same = [r.seconds for r in results if r.ran and r.planted == is_bug] or [seconds]
            rest = sum(_is_bug(m, name2) for m, name2 in kernels[i + 1:])
            bug_mean = _mean([r.seconds for r in results if r.ran and r.planted], same)
            correct_mean = _mean([r.seconds for r in results if r.ran and not r.planted], same)
            estimate = rest * bug_mean + (left - rest) * correct_mean
            state = "CUT" if cut else ("found" if result.detected else "not flagged")
            verdict = "---" if cut else ("ok " if result.ok else "BAD")
            progress(f"[{i + 1}/{len(kernels)}] {verdict} {name}: {state} after {result.examples} examples in "
                     f"{_duration(seconds)} (elapsed {_duration(elapsed)}, about {_duration(estimate)} left) {message[:80]}")
    return results


def _mean(values: list[float], fallback: list[float]) -> float:
    use = values or fallback
    return sum(use) / len(use)
