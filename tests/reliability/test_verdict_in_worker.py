"""Where the worker makes the verdict (a CUDA machine: ``isolation.verdict_in_parent`` is False), its pass
stands: the parent judges again only the cases it asked the raw output of. On the H200 every isolated oracle
case of sdpa-math and sdpa-efficient was a false finding, "the worker answered pass without the kernel's
output", until the parent checked that it had asked (2026-12-05)."""

from __future__ import annotations

import pytest
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.run import isolation
from pa_oracle.fuzz.run.judge import case_judge
from pa_oracle.oracle.case import Case, Heads, Layout

MODULE = "tests.reliability.bad_kernels"
CASES = [Case(Layout.from_lengths([2, 3], [12, 12], 4), Heads(2, 1, 16, 16), seed=3),
         Case(Layout.from_lengths([1], [0], 16), Heads(1, 1, 16, 16), seed=0)]  # (the H200's first case: no key)


@pytest.mark.parametrize("verdict_here", [False, True], ids=["worker-judges", "parent-judges"])
@pytest.mark.parametrize("case", CASES, ids=["two-requests", "no-key"])
def test_a_correct_kernel_passes_wherever_the_verdict_is_made(case: Case, verdict_here: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation, "verdict_in_parent", lambda: verdict_here)
    with case_judge(UserKernel.from_spec(f"{MODULE}:correct"), isolate=True, timeout=120) as judged:
        outcome = judged(case)
    assert outcome.status == "pass", outcome.message


def test_the_worker_s_failure_stands_where_the_worker_judges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation, "verdict_in_parent", lambda: False)
    with case_judge(UserKernel.from_spec("pa_oracle.fuzz.quality.planted:last_page_off_by_one"), isolate=True,
                    timeout=120) as judged:
        outcome = judged(Case(Layout.from_lengths([1, 1], [9, 7], 4), Heads(2, 2, 16, 16), seed=1))
    assert outcome.status == "fail" and "out max error" in outcome.message, outcome.message
