"""The worker judging cases side by side (``pa_oracle.fuzz.run.serve``): the answers are the ones a
worker judging one case at a time gives, a death or a hang belongs to the case in its kernel, and a
non-pass of a case judged beside another is judged again alone before it is believed."""

from __future__ import annotations

import pytest
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.run.isolation import Worker
from pa_oracle.fuzz.run.runner import ORACLE
from pa_oracle.fuzz.run.serve import BadThreads, threads_for, threads_from_env
from pa_oracle.oracle.case import Case, Heads, Layout
from pa_oracle.oracle.tolerance import Tolerance

ONE_PAGE = [Case(Layout.from_lengths([q], [kv], 256), Heads(8, 2, 64, 64), seed=s) for s, (q, kv) in enumerate([(64, 256), (1, 200), (7, 100)])]
MANY_PAGES = Case(Layout.from_lengths([1], [40], 4), Heads(1, 1, 8, 8))


def _judge_all(worker: Worker, spec: str, cases: list[Case], tolerance: Tolerance | None = None) -> list[tuple[str, str]]:
    kernel = UserKernel.from_spec(spec)
    for case in cases:
        worker.submit(spec, kernel.capabilities, case, ORACLE, False)
    answers = []
    while worker.pending:
        outcome, _ = worker.collect()
        answers.append((outcome.case.case_id, outcome.status))
    return answers


def test_side_by_side_the_answers_are_one_at_a_time_answers_in_order() -> None:
    spec = "tests.reliability.bad_kernels:slightly_off"
    cases = [*ONE_PAGE, MANY_PAGES.replace(seed=3), MANY_PAGES.replace(seed=4)]
    answers = {}
    for threads in (1, 3):
        worker = Worker(timeout=60, threads=threads)
        try:
            answers[threads] = _judge_all(worker, spec, cases)
        finally:
            worker.close()
    assert [case_id for case_id, _ in answers[3]] == [case.case_id for case in cases]
    assert answers[3] == answers[1]


def test_a_death_belongs_to_the_case_in_its_kernel_and_the_cases_before_it_are_judged() -> None:
    worker = Worker(timeout=60, threads=2)
    try:
        answers = _judge_all(worker, "tests.quality.crashers:segfaults_on_many_pages", [ONE_PAGE[0], MANY_PAGES, ONE_PAGE[1]])
    finally:
        worker.close()
    assert answers == [(ONE_PAGE[0].case_id, "pass"), (MANY_PAGES.case_id, "crash")], "the case after the crash is dropped"


def test_a_hang_belongs_to_the_case_in_its_kernel() -> None:
    worker = Worker(timeout=3, first_case_factor=1, threads=2)
    try:
        answers = _judge_all(worker, "tests.quality.crashers:hangs_on_many_pages", [ONE_PAGE[0], MANY_PAGES])
    finally:
        worker.close()
    assert answers == [(ONE_PAGE[0].case_id, "pass"), (MANY_PAGES.case_id, "crash")]


def test_a_failure_beside_another_case_is_judged_again_alone() -> None:
    """The kernel is wrong only in a judge thread: every failing answer judged beside another case is
    judged again alone (in the worker's main thread), and passes there."""
    worker = Worker(timeout=60, threads=2)
    cases = [case.replace(seed=case.seed + 10 * i) for i in range(2) for case in ONE_PAGE]
    try:
        answers = _judge_all(worker, "tests.quality.crashers:wrong_in_a_judge_thread", cases)
    finally:
        worker.close()
    assert [case_id for case_id, _ in answers] == [case.case_id for case in cases]
    assert worker.rejudged >= 2 and worker.rejudged_changed == worker.rejudged, (answers, worker.rejudged, worker.rejudged_changed)
    assert sum(status == "pass" for _, status in answers) >= worker.rejudged


def test_the_thread_count_comes_from_the_environment_or_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PA_ORACLE_JUDGE_THREADS", raising=False)
    assert threads_from_env() is None
    cpu, gpu = UserKernel.from_spec("tests.reliability.bad_kernels:correct"), type("GPU", (), {"device": "cuda"})()
    assert threads_for(cpu, None) == 1 and threads_for(gpu, None) > 1 and threads_for(gpu, 1) == 1
    monkeypatch.setenv("PA_ORACLE_JUDGE_THREADS", "3")
    assert threads_from_env() == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("PA_ORACLE_JUDGE_THREADS", bad)
        with pytest.raises(BadThreads, match="PA_ORACLE_JUDGE_THREADS"):
            Worker()


def test_a_campaign_notes_verdicts_that_changed_when_judged_again_alone() -> None:
    """The kernel passes in the worker's main thread only: whatever the campaign's verdicts, every case
    judged again alone passed there, and the backend's notes say how many changed."""
    from pa_oracle.fuzz.campaign.engine import CampaignConfig, Shared, fuzz_backend
    from pa_oracle.fuzz.draw.strategies import Limits

    spec = "tests.quality.crashers:wrong_in_a_judge_thread"
    worker = Worker(timeout=60, threads=2)
    try:
        result = fuzz_backend(UserKernel.from_spec(spec), CampaignConfig(examples=12, limits=Limits(max_batch=2, max_kv_len=40)), shared=Shared(workers={"cpu": worker}))
    finally:
        worker.close()
    assert worker.rejudged_changed >= 1
    assert any(note.startswith(f"{worker.rejudged_changed} case(s) judged beside another") for note in result.notes), result.notes


def test_kernels_take_their_turns_in_the_order_the_cases_were_dispatched() -> None:
    """A newer case never enters its kernel before an older one has left its own (or finished without
    one): else the older case's time would hold the other's kernel, a false hang."""
    import threading
    import time

    from pa_oracle.fuzz.run.serve import KernelTurns

    turns, order = KernelTurns(), []
    first, second = turns.ticket(), turns.ticket()

    def newer() -> None:
        turns.enter(second)
        order.append("second")
        turns.leave(second)

    thread = threading.Thread(target=newer)
    thread.start()
    time.sleep(0.2)
    assert order == [], "the newer case entered before the older one's turn"
    turns.enter(first)
    order.append("first")
    turns.leave(first)
    thread.join(5)
    assert order == ["first", "second"]
    skipped, after = turns.ticket(), turns.ticket()
    turns.leave(skipped)  # a case that never took its turn (a skip) gives it up
    turns.enter(after)
    turns.leave(after)
