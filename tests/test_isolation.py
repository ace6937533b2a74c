from __future__ import annotations

from backends.user import UserKernel
from fuzz.isolation import IsolatedBackend
from oracle.case import Case, Heads, Layout


def test_a_segfault_is_a_finding_and_the_worker_restarts() -> None:
    spec = "tests.quality.crashers:segfaults"
    worker = IsolatedBackend(UserKernel.from_spec(spec), spec, timeout=60)
    try:
        dies = worker.check(Case(Layout.from_lengths([1], [40], 4), Heads(1, 1, 8, 8)))
        assert dies.status == "crash" and "died" in dies.message
        survives = worker.check(Case(Layout.from_lengths([1], [0], 4), Heads(1, 1, 8, 8)))
        assert survives.status == "pass", survives.message
    finally:
        worker.close()


def test_a_hang_is_a_finding_after_the_timeout() -> None:
    spec = "tests.quality.crashers:hangs"
    worker = IsolatedBackend(UserKernel.from_spec(spec), spec, timeout=3)
    try:
        outcome = worker.check(Case(Layout.from_lengths([1], [3], 4), Heads(1, 1, 8, 8)))
        assert outcome.status == "crash" and "hang" in outcome.message
    finally:
        worker.close()
