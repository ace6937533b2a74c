"""Several worker processes on one device (``pa_oracle.fuzz.run.pool``): the outcomes come back in the order
the cases were sent, as one process gives them; a death drops only what its own process was sent after
the case in its kernel; a campaign draws, counts and finds the same with one process or two."""

from __future__ import annotations

import time

import pytest
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.engine import CampaignConfig, Shared, fuzz_backend
from pa_oracle.fuzz.run.isolation import OutOfTime, Worker
from pa_oracle.fuzz.run.pool import BadWorkerProcesses, WorkerPool, worker_processes
from pa_oracle.fuzz.run.runner import ORACLE
from pa_oracle.oracle.case import Case
from tests.test_judge_threads import MANY_PAGES, ONE_PAGE
from tests.test_overlap import PLANTED, TINY, _same

ONE_PAGE_MORE = [case.replace(seed=case.seed + 10 * i) for i in range(3) for case in ONE_PAGE]


def _send(pool: Worker | WorkerPool, spec: str, cases: list[Case], deadline: float | None = None) -> None:
    kernel = UserKernel.from_spec(spec)
    for case in cases:
        pool.submit(spec, kernel.capabilities, case, ORACLE, False, deadline)


def _answers(pool: Worker | WorkerPool, deadline: float | None = None) -> list[tuple[str, str]]:
    answers = []
    while pool.pending:
        outcome, _ = pool.collect(deadline)
        answers.append((outcome.case.case_id, outcome.status))
    return answers


def _verdicts(pool: Worker | WorkerPool) -> list[tuple[str, str]]:
    """Each case's id and verdict (its message holds the errors)."""
    answers = []
    while pool.pending:
        outcome, _ = pool.collect()
        answers.append((outcome.case.case_id, outcome.message))
    return answers


def test_a_pool_answers_in_the_order_sent_as_one_process_does() -> None:
    spec, cases = "tests.reliability.bad_kernels:slightly_off", [*ONE_PAGE_MORE[:4], MANY_PAGES, MANY_PAGES.replace(seed=4)]
    warm = ONE_PAGE_MORE[6:8]  # (the first float32 CPU call in a process sometimes differs from the next by ~3e-5)
    worker, pool = Worker(timeout=60, threads=1), WorkerPool(2, timeout=60, threads=1)
    try:
        _send(worker, spec, warm + cases)
        alone = _verdicts(worker)[2:]
        _send(pool, spec, warm + cases)
        assert [w.pending for w in pool.workers] == [4, 4], "each process was sent half of the cases"
        assert pool.pending_ids == [case.case_id for case in warm + cases]
        together = _verdicts(pool)[2:]
    finally:
        worker.close()
        pool.close()
    assert together == alone and [case_id for case_id, _ in together] == [case.case_id for case in cases]
    assert all(message.startswith("FAIL: out max error") for _, message in alone), alone
    assert [w.starts for w in pool.workers] == [1, 1] and pool.starts == 2


def test_a_pool_refuses_another_backends_case_while_cases_are_pending() -> None:
    spec, other = "tests.reliability.bad_kernels:correct", "tests.reliability.bad_kernels:slightly_off"
    pool = WorkerPool(2, timeout=60, threads=1)
    try:
        _send(pool, spec, ONE_PAGE_MORE[:1])  # one process holds a case; the other is idle
        with pytest.raises(AssertionError, match="pending"):
            _send(pool, other, ONE_PAGE_MORE[1:2])
        assert len(_answers(pool)) == 1
        _send(pool, other, ONE_PAGE_MORE[1:2])  # nothing pending: another backend is welcome
        assert len(_answers(pool)) == 1
    finally:
        pool.close()


def test_a_death_drops_only_what_its_own_process_was_sent_after_the_case_in_its_kernel() -> None:
    """Sent in turn: process 0 gets cases 0, 2 (many pages: it dies there), 4; process 1 gets 1, 3, 5. Case 4
    was never judged; case 5, sent later but to the other process, is."""
    cases = [ONE_PAGE_MORE[0], ONE_PAGE_MORE[1], MANY_PAGES, *ONE_PAGE_MORE[2:5]]
    pool = WorkerPool(2, timeout=60, threads=1)
    try:
        _send(pool, "tests.quality.crashers:segfaults_on_many_pages", cases)
        first = [pool.collect()[0].status for _ in range(2)]
        crash, _ = pool.collect()
        left = pool.pending_ids
        rest = _answers(pool)
    finally:
        pool.close()
    # (judged, not crashed: a loaded machine's first float32 CPU call in a fresh process may round past the limit)
    assert all(status in ("pass", "fail") for status in first)
    assert crash.status == "crash" and crash.case.case_id == MANY_PAGES.case_id and "worker process died" in crash.message
    assert left == [cases[3].case_id, cases[5].case_id], "case 4 was dropped with its process"
    assert [case_id for case_id, _ in rest] == left and all(status in ("pass", "fail") for _, status in rest)
    assert pool.workers[1].starts == 1, "the other process was not restarted"


def test_the_budget_running_out_drops_every_pending_case() -> None:
    pool = WorkerPool(2, timeout=60, threads=1)
    try:
        _send(pool, "tests.quality.crashers:hangs_on_many_pages", [ONE_PAGE[0], MANY_PAGES, ONE_PAGE[1], ONE_PAGE[2]])
        assert pool.collect()[0].status in ("pass", "fail")  # (judged: a first float32 CPU call may round past)
        with pytest.raises(OutOfTime):
            pool.collect(deadline=time.monotonic() + 2)
        assert pool.pending == 0 and pool.pending_ids == [] and all(w.pending == 0 for w in pool.workers)
    finally:
        pool.close()


def _campaign(name: str, processes: int, examples: int):  # type: ignore[no-untyped-def]
    pool = WorkerPool(processes, timeout=120)
    try:
        return fuzz_backend(UserKernel.from_spec(f"{PLANTED}:{name}"), CampaignConfig(examples=examples, limits=TINY, isolate=True, case_timeout=120, seed=3), shared=Shared(workers={"cpu": pool}))
    finally:
        pool.close()


def test_a_campaign_draws_counts_and_shrinks_the_same_with_two_processes() -> None:
    for name, examples in (("correct_attention", 120), ("top_left_causal", 200)):
        one, two = _campaign(name, 1, examples), _campaign(name, 2, examples)
        assert one.status == ("done" if name == "correct_attention" else "finding"), one.status
        _same(one, two)


def test_a_campaign_finds_a_crash_the_same_with_two_processes() -> None:
    spec = "tests.quality.crashers:segfaults_on_many_pages"
    results = []
    for processes in (1, 2):
        pool = WorkerPool(processes, timeout=60)
        try:
            results.append(fuzz_backend(UserKernel.from_spec(spec), CampaignConfig(examples=60, limits=TINY, isolate=True, case_timeout=60, seed=3), shared=Shared(workers={"cpu": pool})))
        finally:
            pool.close()
    one, two = results
    assert one.status == "finding" and "worker process died" in one.findings[0].message, one.findings
    _same(one, two)


def test_worker_processes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PA_ORACLE_WORKER_PROCESSES", raising=False)
    assert worker_processes("cpu", cores=64) == 1, "a CPU backend's judge and kernel share the host's cores"
    assert [worker_processes("cuda", cores=cores) for cores in (4, 8, 15, 16, 64)] == [1, 2, 2, 3, 3]
    monkeypatch.setenv("PA_ORACLE_WORKER_PROCESSES", "3")
    assert worker_processes("cuda") == 3 and worker_processes("cpu") == 3
    for bad in ("0", "two", "1.5", "-2"):
        monkeypatch.setenv("PA_ORACLE_WORKER_PROCESSES", bad)
        with pytest.raises(BadWorkerProcesses, match="PA_ORACLE_WORKER_PROCESSES"):
            worker_processes("cuda")


def test_a_bad_worker_process_count_is_bad_input(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from click.testing import CliRunner
    from pa_oracle.cli import main

    monkeypatch.setenv("PA_ORACLE_WORKER_PROCESSES", "none")
    result = CliRunner().invoke(main, ["fuzz", "-b", "sdpa-math", "-n", "4", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "PA_ORACLE_WORKER_PROCESSES='none'" in result.output, result.output


def test_the_pipeline_keeps_each_outcome_with_its_own_case_when_a_process_dies() -> None:
    """The campaign's queue of cases judged ahead (``IsolatedJudge``) across a death in one of two processes: every
    collected outcome is its own case's, and the case dropped with the dead process has none."""
    from pa_oracle.fuzz.run.isolation import IsolatedBackend
    from pa_oracle.fuzz.run.judge import IsolatedJudge

    spec = "tests.quality.crashers:segfaults_on_many_pages"
    cases = [ONE_PAGE_MORE[0], ONE_PAGE_MORE[1], MANY_PAGES, *ONE_PAGE_MORE[2:5]]
    pool = WorkerPool(2, timeout=60, threads=1)
    try:
        judge = IsolatedJudge(IsolatedBackend(UserKernel.from_spec(spec), spec, worker=pool), ORACLE)
        for case in cases:
            judge.submit(case, None)
        judge.drain(None)
    finally:
        pool.close()
    done = {case_id: got[0].case.case_id for case_id, got in judge.done.items()}  # type: ignore[union-attr]
    assert done == {case.case_id: case.case_id for i, case in enumerate(cases) if i != 4}
    assert judge.done[MANY_PAGES.case_id][0].status == "crash"  # type: ignore[index]


def test_a_backend_that_kills_its_loading_process_leaves_the_pool_ready_for_the_next() -> None:
    """Its load ends the process that loads it while the other process's load is still answering: the failure is
    the load's (not the budget's, though a deadline is set), and the next backend loads at once, not after a
    wait for a stale answer."""
    from pa_oracle.fuzz.run.isolation import WorkerStartError

    good = "tests.reliability.bad_kernels:correct"
    capabilities = UserKernel.from_spec(good).capabilities
    pool = WorkerPool(2, timeout=60, threads=1, startup=60)
    try:
        with pytest.raises(WorkerStartError, match="did not load"):
            pool.ensure("tests.quality.dies_on_load:kernel", capabilities, deadline=time.monotonic() + 120)
        assert not any(worker.in_flight for worker in pool.workers)
        started = time.monotonic()
        pool.ensure(good, capabilities)
        assert time.monotonic() - started < 30, "the next backend waited for an answer that never comes"
        _send(pool, good, ONE_PAGE_MORE[:2])
        assert [case_id for case_id, _ in _answers(pool)] == [case.case_id for case in ONE_PAGE_MORE[:2]]
    finally:
        pool.close()
