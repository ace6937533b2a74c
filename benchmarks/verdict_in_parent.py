"""What making an isolated case's verdict in the parent costs (issue 31): cases per second of one worker
judging a fixed list of cases (a user kernel and ``sdpa-math``, isolation on), the parent judging each
returned output again from its own copy of the case. Run it on two checkouts (``PYTHONPATH=CHECKOUT``)
to compare; it prints one line per backend: cases/s and ms a case, the worker's start excluded.

    python benchmarks/verdict_in_parent.py [--cases N] [--repeats R]
"""

from __future__ import annotations

import argparse
import time

from pa_oracle.backends import get_backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.run.judge import case_judge
from pa_oracle.oracle.case import Case, Heads, Layout

BACKENDS = ("tests.reliability.bad_kernels:correct", "sdpa-math")


def cases(n: int) -> list[Case]:
    """``n`` cases of a campaign's usual size on the CPU: 1-3 requests, 1-64 query rows, up to 300 keys."""
    shapes = [([1], [200]), ([64], [256]), ([7, 1], [100, 300]), ([3, 5, 1], [40, 12, 90])]
    return [Case(Layout.from_lengths(q, kv, 16), Heads(8, 2, 64, 64), seed=i) for i in range(n) for q, kv in [shapes[i % len(shapes)]]]


def rate(spec: str, drawn: list[Case], repeats: int) -> float:
    """The best of ``repeats`` passes over ``drawn`` in one warm worker: cases a second."""
    backend = UserKernel.from_spec(spec) if ":" in spec else get_backend(spec)
    best = float("inf")
    with case_judge(backend, isolate=True, timeout=300) as judged:
        judged(drawn[0])  # the worker's start and the backend's load are not the cases' cost
        for _ in range(repeats):
            start = time.perf_counter()
            statuses = [judged(case).status for case in drawn]
            best = min(best, time.perf_counter() - start)
            assert set(statuses) <= {"pass", "unsupported"}, statuses
    return len(drawn) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    drawn = cases(args.cases)
    for spec in BACKENDS:
        per_second = rate(spec, drawn, args.repeats)
        print(f"{spec}: {per_second:.1f} cases/s ({1000 / per_second:.1f} ms a case)")


if __name__ == "__main__":
    main()
