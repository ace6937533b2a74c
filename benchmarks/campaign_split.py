"""Where a campaign process's time goes, per backend: waiting for the worker, waiting for draw processes,
drawing itself, queueing, saving state (a benchmark: is a backend bound by its judge or by its draws?).

    python benchmarks/campaign_split.py --time-budget 60 -b flashinfer-decode -b sdpa-efficient
    python benchmarks/campaign_split.py --time-budget 30 -b sdpa-math --isolate          # CPU

Runs ``pa-oracle fuzz`` in this process (its usual arguments after ``--``, e.g. ``-- --compile-budget 5``) with
the campaign engine's steps wrapped in timers, and prints for each backend its turn's wall time, cases judged
(a second: over the whole turn, and from its first judged case on), and what the campaign process spent it on.
A backend whose process mostly waits for outcomes is bound by its worker's judging; one that mostly waits for
draw processes or draws itself is bound by drawing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from pa_oracle import cli
from pa_oracle.fuzz.campaign import drawers, engine, state
from pa_oracle.fuzz.run import isolation, judge, pool

# (owner, attribute, step): the campaign process's steps; a step's time excludes the steps it calls
STEPS = [
    (drawers.Drawers, "take", "waiting for a draw process"),
    (engine, "draw_chunk", "drawing itself"),
    (judge.Judge, "submit", "queueing a case"),
    (judge.Judge, "_collect_one", "waiting for an outcome"),
    (state.CampaignState, "save", "saving the state"),
    (pool.WorkerPool, "ensure", "starting and loading workers"),
    (isolation.Worker, "ensure", "starting and loading workers"),
]


class Split:
    """Seconds per (backend, step), the innermost step counted (a step called inside another is not counted twice)."""

    def __init__(self) -> None:
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.turns: dict[str, float] = defaultdict(float)
        self.judged: dict[str, list[float]] = defaultdict(list)  # monotonic time of each judged case
        self.backend = "(none)"
        self._stack: list[list[Any]] = []  # [step, started, seconds of inner steps]

    def wrap(self, step: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stack.append([step, time.monotonic(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                _, started, inner = self._stack.pop()
                spent = time.monotonic() - started
                self.seconds[self.backend][step] += spent - inner
                if self._stack:
                    self._stack[-1][2] += spent

        return timed

    def turn(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def turn(backend: Any, *args: Any, **kwargs: Any) -> Any:
            self.backend, started = backend.name, time.monotonic()
            try:
                return fn(backend, *args, **kwargs)
            finally:
                self.turns[backend.name] += time.monotonic() - started

        return turn

    def count(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def count(result: Any, outcome: Any) -> Any:
            if outcome.status != "unsupported":
                self.judged[result.backend].append(time.monotonic())
            return fn(result, outcome)

        return count

    def report(self) -> None:
        for backend, wall in self.turns.items():
            times = self.judged.get(backend, [])
            steady = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0
            print(f"{backend}: {len(times)} judged in a {wall:.1f}s turn ({len(times) / max(wall, 1e-9):.1f}/s over the turn, "
                  f"{steady:.1f}/s from its first judged case on)")
            spent = self.seconds[backend]
            for step, seconds in sorted(spent.items(), key=lambda item: -item[1]):
                print(f"    {step:<30} {seconds:7.2f}s  {seconds / max(wall, 1e-9):6.1%}")
            other = wall - sum(spent.values())
            print(f"    {'everything else':<30} {other:7.2f}s  {other / max(wall, 1e-9):6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-b", "--backend", action="append", required=True)
    parser.add_argument("--time-budget", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--isolate", action="store_true", help="isolate cases in a worker (the default on a GPU)")
    parser.add_argument("rest", nargs="*", help="more pa-oracle fuzz arguments (after --)")
    args = parser.parse_args()
    split = Split()
    for owner, attr, step in STEPS:
        setattr(owner, attr, split.wrap(step, getattr(owner, attr)))
    engine.fuzz_backend = split.turn(engine.fuzz_backend)  # type: ignore[assignment]
    engine._count = split.count(engine._count)  # type: ignore[assignment]
    with tempfile.TemporaryDirectory(prefix="pa-split-") as out:
        sys.argv = ["pa-oracle", "fuzz", "--time-budget", str(args.time_budget), "-n", "1000000", "--seed", str(args.seed),
                    "--out", out, "--overwrite", *[a for b in args.backend for a in ("-b", b)], *args.rest]
        if args.isolate:
            sys.argv.append("--isolate")
        try:
            cli.main()
        except SystemExit as exit_:
            print(f"(pa-oracle fuzz exited {exit_.code})")
    split.report()


if __name__ == "__main__":
    main()
