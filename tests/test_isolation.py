from __future__ import annotations

import math
import time

import pytest
from pa_oracle.backends import get_backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.run.isolation import (
    BadTimeout,
    IsolatedBackend,
    OutOfTime,
    check_timeout,
    isolatable,
    isolated_by_default,
)
from pa_oracle.fuzz.run.judge import case_judge
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import Case, Heads, Layout
from pa_oracle.oracle.tolerance import Tolerance

CASE = Case(Layout.from_lengths([1, 2], [5, 3], 4), Heads(2, 1, 8, 8))
LOOSE = Tolerance(max_ratio=1e9, mean_ratio=1e9, floor_factor=1e9)


def test_a_segfault_is_a_finding_and_the_worker_restarts() -> None:
    spec = "tests.quality.crashers:segfaults"
    worker = IsolatedBackend(UserKernel.from_spec(spec), spec, timeout=60)
    try:
        dies = worker.check(Case(Layout.from_lengths([1], [40], 4), Heads(1, 1, 8, 8)))
        assert dies.status == "crash" and dies.message == "worker process died (signal SIGSEGV) (worker restarted)"
        survives = worker.check(Case(Layout.from_lengths([1], [0], 4), Heads(1, 1, 8, 8)))
        assert survives.status == "pass", survives.message
        assert worker.starts == 2
    finally:
        worker.close()


def test_a_hang_is_a_finding_after_the_timeout() -> None:
    spec = "tests.quality.crashers:hangs"
    worker = IsolatedBackend(UserKernel.from_spec(spec), spec, timeout=1, first_case_factor=1)
    try:
        began = time.monotonic()
        worker._start()  # (the timeout counts from the case's send: a start, 15 s on a loaded machine, is not in it)
        start = time.monotonic() - began
        began = time.monotonic()
        outcome = worker.check(Case(Layout.from_lengths([1], [3], 4), Heads(1, 1, 8, 8)))
        took = time.monotonic() - began
        assert outcome.status == "crash" and outcome.message == "hang: no answer after 1 s (worker restarted)"
        # the kernel sleeps an hour: its case ends at the timeout, plus a kill that costs less than this start
        assert 1.0 <= took < 1.0 + max(2.0, 2 * start), (took, start)
    finally:
        worker.close()


def test_the_first_case_after_a_start_gets_the_longer_allowance() -> None:
    """A first call may compile: 2 s passes with timeout 1 x factor 3; the same 2 s later is a hang."""
    spec = "tests.reliability.bad_kernels:sleeps_two_seconds"
    worker = IsolatedBackend(UserKernel.from_spec(spec), spec, timeout=1, first_case_factor=3)
    try:
        assert worker.case_limit() == 3
        assert worker.check(CASE).status == "pass"
        assert worker.case_limit() == 1
        later = worker.check(CASE)
        assert later.status == "crash" and later.message.startswith("hang: no answer after 1 s")
        assert worker.case_limit() == 3, "a restarted worker's first case gets the allowance again"
    finally:
        worker.close()


def test_a_case_cut_off_by_the_deadline_is_out_of_time_not_a_hang() -> None:
    spec = "tests.reliability.bad_kernels:hangs"
    worker = IsolatedBackend(UserKernel.from_spec(spec), spec, timeout=100)
    try:
        worker._start()
        with pytest.raises(OutOfTime, match="the time budget ran out after"):
            worker.check(CASE, deadline=time.monotonic() + 1)
    finally:
        worker.close()


def test_the_worker_judges_with_the_callers_tolerance_and_returns_tensors_on_the_host() -> None:
    spec = "tests.reliability.bad_kernels:slightly_off"
    kernel = UserKernel.from_spec(spec)
    assert check_case(kernel, CASE).status == "fail" and check_case(kernel, CASE, LOOSE).status == "pass"
    for tolerance, status in ((Tolerance(), "fail"), (LOOSE, "pass")):
        with case_judge(kernel, tolerance=tolerance, keep_output=True) as check:
            outcome = check(CASE)
        assert outcome.status == status, outcome.message
        assert outcome.verdict is not None and outcome.verdict.error is not None and outcome.verdict.error.device.type == "cpu"
        assert outcome.output is not None and tuple(outcome.output.out.shape) == (3, 2, 8)


def test_isolation_is_the_default_for_user_kernels_and_not_for_pure_torch_cpu_backends() -> None:
    assert isolated_by_default(UserKernel.from_spec("tests.reliability.bad_kernels:correct"))
    assert not isolated_by_default(get_backend("sdpa-math"))

    def local(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):  # type: ignore[no-untyped-def]
        raise AssertionError

    assert isolatable(UserKernel(local)) is None, "a function a worker cannot import runs in-process"
    assert isolatable(get_backend("sdpa-math")) == "sdpa-math"


@pytest.mark.parametrize("seconds", [0, -1.0, math.nan, math.inf, True])
def test_a_case_timeout_must_be_finite_and_positive(seconds: float) -> None:
    with pytest.raises(BadTimeout, match="finite number of seconds > 0"):
        check_timeout(seconds)
    with pytest.raises(BadTimeout):
        IsolatedBackend(get_backend("sdpa-math"), "sdpa-math", timeout=seconds)


def test_a_user_kernel_a_worker_cannot_import_runs_in_process_with_a_note(tmp_path) -> None:
    from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
    from pa_oracle.fuzz.draw.strategies import Limits
    from pa_oracle.fuzz.quality.planted import correct_attention

    def local(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,  # type: ignore[no-untyped-def]
              window_left, logits_soft_cap):
        return correct_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                                 kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale,
                                 window_left=window_left, logits_soft_cap=logits_soft_cap)

    kernel = UserKernel(local)
    result = fuzz_backend(kernel, CampaignConfig(examples=3, limits=Limits(max_batch=2, max_kv_len=12)))
    assert result.status == "done" and result.passed == 3, result.line()
    assert result.notes == [f"{kernel.name} is not importable by its name: its cases ran in this process"]


def _user(name: str) -> tuple[str, UserKernel]:
    spec = f"tests.reliability.bad_kernels:{name}"
    return spec, UserKernel.from_spec(spec)


def test_one_worker_serves_several_backends_and_restarts_after_a_crash_before_another_backend() -> None:
    from pa_oracle.fuzz.run.isolation import Worker
    from pa_oracle.fuzz.run.runner import ORACLE

    worker = Worker(timeout=60)
    try:
        (good, good_kernel), (bad, bad_kernel) = _user("correct"), _user("raises_value_error")
        outcome, start_seconds = worker.check(good, good_kernel.capabilities, CASE, ORACLE, False)
        assert outcome.status == "pass" and start_seconds > 0 and worker.starts == 1
        outcome, start_seconds = worker.check(bad, bad_kernel.capabilities, CASE, ORACLE, False)
        assert outcome.status == "crash" and worker.starts == 1, "a second backend loads into the same process"
        again, _ = worker.check(bad, bad_kernel.capabilities, CASE, ORACLE, False)
        assert again.status == "crash" and worker.starts == 1, "the crashing backend's own next case (shrinking) stays"
        after, start_seconds = worker.check(good, good_kernel.capabilities, CASE, ORACLE, False)
        assert after.status == "pass" and worker.starts == 2 and start_seconds > 0, "another backend gets a fresh process"
    finally:
        worker.close()


def test_a_backend_that_cannot_load_in_the_shared_worker_is_a_start_error_not_a_finding() -> None:
    from pa_oracle.fuzz.run.isolation import Worker, WorkerStartError
    from pa_oracle.fuzz.run.runner import ORACLE

    worker = Worker(timeout=60)
    try:
        good, kernel = _user("correct")
        with pytest.raises(WorkerStartError, match="could not load tests.reliability.bad_kernels:no_such_kernel"):
            worker.check("tests.reliability.bad_kernels:no_such_kernel", kernel.capabilities, CASE, ORACLE, False)
        assert worker.check(good, kernel.capabilities, CASE, ORACLE, False)[0].status == "pass"
    finally:
        worker.close()


def test_one_backend_cannot_loosen_torchs_numerics_for_the_next_in_the_shared_worker() -> None:
    from pa_oracle.fuzz.run.isolation import Worker
    from pa_oracle.fuzz.run.runner import ORACLE

    worker = Worker(timeout=60)
    try:
        (flips, flipper), (strict, checker) = _user("flips_tf32"), _user("refuses_loosened_numerics")
        flipped, _ = worker.check(flips, flipper.capabilities, CASE, ORACLE, False)
        assert flipped.status == "fail" and "changed torch's numerics switches during its call" in flipped.message, flipped.message
        assert "torch.backends.cuda.matmul.allow_tf32 False -> True" in flipped.message, flipped.message
        outcome, _ = worker.check(strict, checker.capabilities, CASE, ORACLE, False)
        assert outcome.status == "pass" and worker.starts == 1, outcome.message
    finally:
        worker.close()


def test_a_pass_comes_back_without_its_per_element_errors_unless_asked() -> None:
    spec = "tests.reliability.bad_kernels:slightly_off"
    kernel = UserKernel.from_spec(spec)
    for pass_errors in (False, True):
        loose, strict = (IsolatedBackend(kernel, spec, tolerance=t, pass_errors=pass_errors) for t in (LOOSE, Tolerance()))
        try:
            passing, failing = loose.check(CASE), strict.check(CASE)
        finally:
            loose.close()
            strict.close()
        assert passing.status == "pass" and passing.verdict is not None and passing.verdict.out is not None
        assert passing.verdict.out.ratio == check_case(kernel, CASE, LOOSE).verdict.out.ratio
        assert (passing.verdict.error is not None) == pass_errors and (passing.verdict.lse_error is not None) == pass_errors
        assert failing.status == "fail" and failing.verdict.error is not None, "a failing verdict keeps every tensor"
    with case_judge(kernel, tolerance=LOOSE) as check:
        assert check(CASE).verdict.error is not None


def test_a_worker_imports_a_backends_library_when_it_loads_it(monkeypatch) -> None:
    """The import (seconds for FlashInfer) counts as loading the backend, not as judging its first cases; a
    library that cannot import there is a load that failed, with the import's error."""
    import sys

    from pa_oracle.backends import get_backend
    from pa_oracle.backends.sdpa import SdpaMath
    from pa_oracle.fuzz.run.serve import _load_backend

    capabilities = get_backend("sdpa-math").capabilities
    monkeypatch.delitem(sys.modules, "wave", raising=False)
    monkeypatch.setattr(SdpaMath, "package", "wave")  # a standard-library module nothing here imports
    _load_backend("sdpa-math", capabilities)
    assert "wave" in sys.modules
    monkeypatch.setattr(SdpaMath, "package", "no_such_kernel_library")
    with pytest.raises(ImportError, match="no_such_kernel_library"):
        _load_backend("sdpa-math", capabilities)
