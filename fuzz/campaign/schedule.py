"""A run's turns: which (backend, check) pair judges next and until when, on the run's compile plan.

Verification model: each turn gives a pair a fair share of the time left (what is left over the pairs still
to go), so time one pair did not use goes to the others and one that overran shortens theirs, never to
nothing. A pair whose variants are still building (``CompilePlan.waiting``) gives its place to the next
and waits only when no other pair is left; that wait is its compile time. A pair left with no variant,
none building, judges nothing: ``not_built`` (no verdict is owed, the reason is said) or, when its builds
failed, ``incomplete`` (no verdict, exit 3).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pa_oracle.fuzz.campaign.compile_plan import CompilePlan
from pa_oracle.fuzz.campaign.state import BackendResult
from pa_oracle.fuzz.campaign.variants import VariantPlan
from pa_oracle.fuzz.run.runner import ORACLE

Pair = tuple[Any, Any]  # (Backend, Check)


@dataclass
class Turn:
    """One pair's turn: judge until ``deadline`` (monotonic; None: no budget), drawing inside ``plan``."""

    pair: Pair
    key: str
    plan: VariantPlan | None
    deadline: float | None
    again: bool  # a later turn of a pair that ran before


@dataclass
class Schedule:
    """The turns of one run (``end``: the run's monotonic end, None without a time budget)."""

    results: dict[str, BackendResult]
    end: float | None
    compile_plan: CompilePlan | None = None
    say: Callable[[str], None] = lambda line: None
    started: set[str] = field(default_factory=set)

    def order(self, todo: list[tuple[Pair, str]]) -> list[tuple[Pair, str]]:
        """``todo`` with the pairs whose variants are building after the ready ones (stable otherwise)."""
        return sorted(todo, key=lambda item: self._waits(item[0]))

    def turns(self, active: list[tuple[Pair, str]], first: bool) -> Iterator[Turn]:
        """The turns of one round over ``active``; a pair that can judge nothing is settled here, not yielded."""
        queue = list(active)
        while queue:
            pair, key = queue.pop(0)
            if not first and self.end is not None and time.monotonic() >= self.end:
                return  # (in the first round every pair gets its turn, so one the budget never reached says so)
            if self._waits(pair):
                if any(not self._waits(other) for other, _key in queue):
                    queue.append((pair, key))  # its builds go on while the others judge
                    continue
                if not self._wait(pair, key):
                    continue
            if self._settled(pair, key):
                continue
            now = time.monotonic()
            deadline = None if self.end is None else now + max(self.end - now, 0.0) / (len(queue) + 1)
            again = key in self.started
            self.started.add(key)
            yield Turn(pair, key, self._plan(pair), deadline, again)

    def _plan(self, pair: Pair) -> VariantPlan | None:
        backend, check = pair
        return self.compile_plan.plan_for(backend) if self.compile_plan is not None and check is ORACLE else None

    def _waits(self, pair: Pair) -> bool:
        backend, check = pair
        return self.compile_plan is not None and check is ORACLE and self.compile_plan.waiting(backend)

    def _wait(self, pair: Pair, key: str) -> bool:
        """Wait for the pair's builds (no one else is left to judge); False if the run's time ran out first."""
        assert self.compile_plan is not None
        backend = pair[0]
        self.say(f"{backend.name}: waiting for its variants to build ...")
        waited = self.compile_plan.wait(backend, self.end)
        result = self.results[key]
        result.seconds += waited
        result.compile_seconds += waited
        if self._waits(pair):
            self._not_built(result, f"its variants were still building when the run's time ran out (waited {waited:.0f}s)")
            return False
        return True

    def _settled(self, pair: Pair, key: str) -> bool:
        """Whether the pair can judge nothing (no usable variant, none building): its result says why."""
        plan = self._plan(pair)
        if plan is None or self.compile_plan is None or (why := self.compile_plan.not_built(pair[0])) is None:
            return False
        result = self.results[key]
        if plan.failed:  # a build that failed is no verdict: the tool (or the library's toolchain) failed
            result.status = "incomplete"
            result.notes.append(why)
            self.say(f"{result.backend}: {why}")
        else:
            self._not_built(result, why)
        return True

    def _not_built(self, result: BackendResult, why: str) -> None:
        """A pair that judges nothing because no variant of it was built in time: said, and no failure of the tool."""
        result.not_built = why
        if result.status in ("pending", "running"):
            result.status = "done"
        self.say(f"{result.backend}: {why}")
