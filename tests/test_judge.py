"""The one judging layer (``pa_oracle.fuzz.run.judge``): the in-process and the isolated judge give the same
outcomes in the same order on the same cases, a crash or a hang in the isolated one is a finding of its own
case, collecting past a deadline is out of time (not a finding), and ``judge_for`` is the one place that
chooses between them."""

from __future__ import annotations

import time

import pytest
from pa_oracle.backends import get_backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.run.isolation import OutOfTime
from pa_oracle.fuzz.run.judge import InProcessJudge, IsolatedJudge, Judge, JudgeSettings, case_judge, judge_for
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from tests.test_judge_threads import MANY_PAGES, ONE_PAGE

PLANTED = "pa_oracle.fuzz.quality.planted"
ISOLATED = JudgeSettings(isolate=True, timeout=60)
IN_PROCESS = JudgeSettings(isolate=False)
# a planted causal mask aligned top-left fails exactly the causal cases with fewer queries than keys
CASES = [
    Case(Layout.from_lengths([2, 1], [6, 5], 4), Heads(2, 1, 8, 8), Options(causal=True), seed=1),
    Case(Layout.from_lengths([3], [3], 4), Heads(2, 2, 8, 8), Options(causal=True), seed=2),
    Case(Layout.from_lengths([1, 2], [5, 3], 4), Heads(2, 1, 8, 8), seed=3),
    Case(Layout.from_lengths([4], [9], 2), Heads(4, 2, 16, 16), Options(causal=True), seed=4),
    Case(Layout.from_lengths([1], [7], 4), Heads(2, 1, 8, 8), seed=5),
]


def _collected(judge: Judge, cases: list[Case]) -> list[tuple[str, str]]:
    """Each case submitted, then every outcome collected: (case id, status) in the order collected."""
    try:
        for case in cases:
            judge.submit(case)
        assert judge.pending == len(cases)
        answers = []
        while judge.pending:
            outcome, seconds = judge.collect()
            assert seconds >= 0
            answers.append((outcome.case.case_id, outcome.status))
        return answers
    finally:
        judge.close()


@pytest.mark.parametrize("name", ["top_left_causal", "correct_attention"])
def test_both_judges_give_the_same_outcomes_in_the_same_order(name: str) -> None:
    kernel = UserKernel.from_spec(f"{PLANTED}:{name}")
    here, isolated = judge_for(kernel, settings=IN_PROCESS), judge_for(kernel, settings=ISOLATED)
    assert isinstance(here, InProcessJudge) and isinstance(isolated, IsolatedJudge)
    answers = _collected(here, CASES)
    assert answers == _collected(isolated, CASES)
    assert [case_id for case_id, _ in answers] == [case.case_id for case in CASES], "in the order submitted"
    expected = ["fail", "pass", "pass", "fail", "pass"] if name == "top_left_causal" else ["pass"] * len(CASES)
    assert [status for _, status in answers] == expected


def test_a_queued_outcome_is_given_to_its_own_case_and_another_case_is_judged_alone() -> None:
    kernel = UserKernel.from_spec(f"{PLANTED}:top_left_causal")
    for settings in (IN_PROCESS, ISOLATED):
        judge = judge_for(kernel, settings=settings)
        try:
            for case in CASES[:3]:
                judge.submit(case)
            outcome, seconds = judge.outcome(CASES[1])  # the second queued: the first is kept for its own case
            assert outcome.case.case_id == CASES[1].case_id and outcome.status == "pass" and seconds is not None
            assert judge.holds(CASES[0].case_id) and not judge.holds(CASES[1].case_id)
            first, _ = judge.outcome(CASES[0])
            assert first.case.case_id == CASES[0].case_id and first.status == "fail"
            alone, seconds = judge.outcome(CASES[3])  # never queued: judged now, after what was queued
            assert alone.status == "fail" and seconds is None and judge.pending == 0
        finally:
            judge.close()


def test_a_crash_in_the_isolated_judge_is_a_finding_of_its_own_case() -> None:
    spec = "tests.quality.crashers:segfaults_on_many_pages"
    judge = judge_for(UserKernel.from_spec(spec), settings=ISOLATED)
    cases = [ONE_PAGE[1], MANY_PAGES, ONE_PAGE[2]]  # it crashes on a case of more than one page
    try:
        for case in cases:
            judge.submit(case)
        first, _ = judge.collect()
        crash, _ = judge.collect()
        assert first.status == "pass" and crash.case.case_id == MANY_PAGES.case_id
        assert crash.status == "crash" and crash.is_finding and "worker process died" in crash.message
        assert judge.pending == 0, "the case sent after the crash was dropped with its process"
        again, seconds = judge.outcome(ONE_PAGE[2])  # asked for: judged again, in a fresh process
        assert again.status == "pass" and seconds is None and judge.starts == 2
    finally:
        judge.close()


def test_a_hang_in_the_isolated_judge_is_a_finding() -> None:
    judge = judge_for(UserKernel.from_spec("tests.reliability.bad_kernels:hangs"), settings=JudgeSettings(True, 1.0))
    try:
        outcome = judge.judge(CASES[2])
    finally:
        judge.close()
    assert outcome.status == "crash" and outcome.is_finding and outcome.message.startswith("hang:"), outcome.message


def test_collecting_past_a_deadline_is_out_of_time_and_drops_what_is_queued() -> None:
    slow = UserKernel.from_spec("tests.reliability.bad_kernels:sleeps_two_seconds")
    for settings in (IN_PROCESS, ISOLATED):
        judge = judge_for(slow, settings=settings)
        try:
            judge.submit(CASES[2])
            judge.submit(CASES[4])
            if settings.isolate:
                deadline = time.monotonic() + 0.5  # the worker is still in the first case's kernel then
            else:
                time.sleep(0.01)
                deadline = time.monotonic() - 0.001  # in this process a case is cut only before it starts
            with pytest.raises(OutOfTime):
                judge.collect(deadline)
            assert judge.pending == 0 and not judge.holds(CASES[4].case_id), "nothing queued will answer"
        finally:
            judge.close()


def test_judge_for_is_the_one_place_that_chooses() -> None:
    assert isinstance(judge_for(get_backend("sdpa-math")), InProcessJudge), "a pure-torch CPU backend: in process"
    user = UserKernel.from_spec(f"{PLANTED}:correct_attention")
    chosen = judge_for(user)
    assert isinstance(chosen, IsolatedJudge) and not chosen.ahead, "a user kernel: isolated by default"
    assert isinstance(judge_for(user, settings=IN_PROCESS), InProcessJudge)
    assert judge_for(user, settings=JudgeSettings(ahead=True)).ahead
    assert not judge_for(user, settings=JudgeSettings(isolate=False, ahead=True)).ahead, "nothing to draw beside"

    def local(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):  # type: ignore[no-untyped-def]
        raise AssertionError("never called")

    here = judge_for(UserKernel(local), settings=ISOLATED)
    assert isinstance(here, InProcessJudge) and here.note is not None and "not importable by its name" in here.note
    workers: dict[str, object] = {}
    first, second = judge_for(user, settings=ISOLATED, workers=workers), judge_for(user, settings=ISOLATED, workers=workers)
    assert list(workers) == ["cpu"] and isinstance(first, IsolatedJudge) and isinstance(second, IsolatedJudge)
    assert first.backend.worker is second.backend.worker is workers["cpu"], "one worker pool per device, shared"


def test_case_judge_judges_one_case_at_a_time_as_judge_for_chooses() -> None:
    with case_judge(UserKernel.from_spec(f"{PLANTED}:top_left_causal"), isolate=False) as judge:
        assert [judge(case).status for case in CASES[:2]] == ["fail", "pass"]
