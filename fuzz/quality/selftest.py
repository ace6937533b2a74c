"""The suite's detection power: fuzz every planted-bug kernel (each must be found) and every
correct-but-differently-rounded kernel (none may be flagged), with a fixed seed and budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pa_oracle.backends.base import Backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.engine import fuzz_backend
from pa_oracle.fuzz.checks.registry import ALL_CHECKS
from pa_oracle.fuzz.quality import planted, planted_composed, planted_families, planted_layouts

# each: BUGS, PLANTED, CORRECT (user-kernel functions, or Backend classes), optional CHECKS (kernel -> check name)
MODULES = (planted, planted_families, planted_layouts, planted_composed)


@dataclass(frozen=True)
class SelftestResult:
    kernel: str
    planted: bool  # True: a bug the suite must find; False: a correct kernel it must pass
    detected: bool
    examples: int
    message: str

    @property
    def ok(self) -> bool:
        return self.detected == self.planted


def run_selftest(
    *, examples: int = 200, correct_examples: int = 150, seed: int = 0, progress: Callable[[str], None] | None = None
) -> list[SelftestResult]:
    results = []
    for module, name in [(m, n) for m in MODULES for n in m.PLANTED + m.CORRECT]:
        is_bug = name in module.BUGS
        target = getattr(module, name)
        kernel = target() if isinstance(target, type) and issubclass(target, Backend) else UserKernel(target, name=f"{module.__name__}:{name}")
        check = ALL_CHECKS[getattr(module, "CHECKS", {}).get(name, "oracle")]
        # in-process: the planted kernels are this project's own torch code (a worker each: ~3 s more per kernel)
        outcome = fuzz_backend(kernel, check=check, examples=examples if is_bug else correct_examples, base_seed=seed,
                               isolate=False)
        message = outcome.finding.message.splitlines()[0] if outcome.finding else ""
        result = SelftestResult(name, is_bug, outcome.finding is not None, outcome.examples, message)
        results.append(result)
        if progress:
            state = "found" if result.detected else "not flagged"
            progress(f"{'ok ' if result.ok else 'BAD'} {name}: {state} after {result.examples} examples {message[:90]}")
    return results
