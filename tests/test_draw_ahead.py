from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from pa_oracle.backends import get_backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.run import ahead as ahead_module
from pa_oracle.fuzz.run.ahead import AHEAD, DrawAhead
from pa_oracle.fuzz.run.isolation import IsolatedBackend
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import Case, Heads, Layout, Options, Storage
from pa_oracle.oracle.tensors import Tensors, draw_key, host_draw, make_tensors, same_bits
from tests.reliability.bad_kernels import correct

CASE = Case(Layout.from_lengths([1, 2], [5, 3], 4), Heads(2, 1, 8, 8), seed=11)
OTHER = dataclasses.replace(CASE, seed=12)
REPORT_HEADS = 3  # the probe kernel answers a case with this many query heads with the draws taken


def reports_draws_ahead(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):  # type: ignore[no-untyped-def]
    if q.shape[1] == REPORT_HEADS:
        raise NotImplementedError(f"draws taken: {AHEAD.taken}")
    return correct(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                   kv_last_page_len=kv_last_page_len)


def assert_same_tensors(a: Tensors, b: Tensors) -> None:
    assert a.memory().keys() == b.memory().keys()
    for name, tensor in a.memory().items():
        assert same_bits(tensor, b.memory()[name]), name
    for name in ("q", "k_cache", "v_cache"):
        assert same_bits(getattr(a, name), getattr(b, name)), name
        assert getattr(a, name).stride() == getattr(b, name).stride(), name


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=cases(get_backend("flashinfer-mla").capabilities, Limits()) | cases(get_backend("flashinfer-decode").capabilities, Limits()))
def test_a_draw_made_ahead_gives_the_tensors_bit_for_bit(case: Case) -> None:
    ahead = DrawAhead(enabled=True)
    ahead.prepare(case)
    draw = ahead.take(case)
    assert draw is not None and ahead.taken == 1
    assert_same_tensors(make_tensors(case, draw=draw), make_tensors(case))


@pytest.mark.parametrize("storage", [Storage(kv="combined", kv_layout="HND"), Storage(q="fused_qkv", pool_offset=64)])
@pytest.mark.parametrize("options", [Options(), Options(q_dtype="bfloat16", kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=2.0)])
@pytest.mark.parametrize("distribution", ["normal", "peaked", "outliers", "near_ties", "exact"])
def test_every_distribution_dtype_and_storage_is_the_same_drawn_ahead(storage: Storage, options: Options, distribution: str) -> None:
    case = dataclasses.replace(CASE, options=options, distribution=distribution, storage=storage)
    ahead = DrawAhead(enabled=True)
    ahead.prepare(case)
    assert_same_tensors(make_tensors(case, draw=ahead.take(case)), make_tensors(case))
    assert ahead.taken == 1


def test_a_draw_for_another_case_is_refused() -> None:
    with pytest.raises(ValueError, match="another case"):
        make_tensors(OTHER, draw=host_draw(CASE))


def test_the_draw_key_holds_what_the_draw_reads() -> None:
    causal = dataclasses.replace(CASE, options=Options(causal=True, window_left=2))
    assert draw_key(causal) == draw_key(CASE)
    assert_same_tensors(make_tensors(causal, draw=host_draw(CASE)), make_tensors(causal))
    changed = [OTHER, dataclasses.replace(CASE, distribution="peaked"), dataclasses.replace(CASE, options=Options(kv_dtype="float8_e4m3fn")),
               dataclasses.replace(CASE, options=Options(q_dtype="float16", kv_dtype="float16")),
               dataclasses.replace(CASE, layout=Layout.from_lengths([1, 2], [5, 4], 4)), dataclasses.replace(CASE, heads=Heads(2, 2, 8, 8))]
    for case in changed:
        assert draw_key(case) != draw_key(CASE), case.summary()
    fp8 = dataclasses.replace(CASE, options=Options(kv_dtype="float8_e4m3fn"))
    for scale in ("k_scale", "v_scale"):
        assert draw_key(dataclasses.replace(fp8, options=Options(kv_dtype="float8_e4m3fn", **{scale: 2.0}))) != draw_key(fp8)


def test_a_draw_is_taken_once_and_only_by_its_case() -> None:
    ahead = DrawAhead(enabled=True)
    ahead.prepare(CASE)
    assert ahead.take(OTHER) is None, "never prepared: drawn directly"
    assert ahead.prepared == 1, "the prepared draw waits for its own case"
    assert ahead.take(CASE) is not None
    assert ahead.take(CASE) is None, "a draw serves one call"


def test_the_bucket_plan_made_ahead_is_the_plan_and_serves_only_its_case() -> None:
    from pa_oracle.oracle.buckets import plan_buckets

    ahead = DrawAhead(enabled=True)
    causal = dataclasses.replace(CASE, options=dataclasses.replace(CASE.options, causal=True))
    ahead.prepare(CASE)
    assert ahead.take(CASE) is not None
    assert ahead.take_plan(causal) is None, "same draw key, other options: planned again"
    ahead.prepare(CASE)
    ahead.take(CASE)
    host = ahead.take_plan(CASE)
    assert host is not None and ahead.take_plan(CASE) is None, "a plan serves one call"
    made, fresh = plan_buckets(CASE, torch.device("cpu"), host), plan_buckets(CASE, torch.device("cpu"))
    assert made.max_kv == fresh.max_kv and made.empty_rows == fresh.empty_rows and torch.equal(made.slots, fresh.slots)
    for a, b in zip(made.buckets, fresh.buckets, strict=True):
        assert (a.nb, a.max_q, a.max_kv, a.contiguous, a.masked) == (b.nb, b.max_q, b.max_kv, b.contiguous, b.masked)
        assert torch.equal(a.first, b.first) and torch.equal(a.last, b.last)


def test_a_case_passed_over_leaves_no_draw_behind() -> None:
    ahead = DrawAhead(enabled=True)
    ahead.prepare(CASE)
    ahead.prepare(OTHER)
    assert ahead.take(OTHER) is not None
    assert ahead.prepared == 0 and ahead.take(CASE) is None, "CASE was skipped: its draw was dropped"


def test_an_unsupported_case_does_not_hand_its_draw_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = DrawAhead(enabled=True)
    monkeypatch.setattr("pa_oracle.fuzz.run.runner.AHEAD", fresh)
    kernel = UserKernel.from_spec("tests.reliability.bad_kernels:correct")
    declined = dataclasses.replace(CASE, options=Options(causal=True))  # the canonical signature has no causal
    assert kernel.unsupported_reason(declined)
    fresh.prepare(declined)
    fresh.prepare(OTHER)
    assert check_case(kernel, declined).status == "unsupported"
    assert check_case(kernel, OTHER).status == "pass"
    assert fresh.taken == 1 and fresh.prepared == 0


def test_two_queued_cases_with_one_key_each_get_a_draw() -> None:
    ahead = DrawAhead(enabled=True)
    twin = dataclasses.replace(CASE, options=Options(causal=True))
    ahead.prepare(CASE)
    ahead.prepare(twin)
    first, second = ahead.take(CASE), ahead.take(twin)
    assert first is not None and second is not None and first.q is not second.q


def test_a_draw_that_raised_is_drawn_again_by_the_case(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(case: Case) -> None:
        raise MemoryError("no room")

    monkeypatch.setattr(ahead_module, "host_draw", fails)
    ahead = DrawAhead(enabled=True)
    ahead.prepare(CASE)
    assert ahead.take(CASE) is None and ahead.taken == 0


def test_switched_off_nothing_is_prepared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PA_ORACLE_DRAW_AHEAD", "0")
    ahead = DrawAhead()
    ahead.prepare(CASE)
    assert not ahead.enabled and ahead.prepared == 0 and ahead.take(CASE) is None


@pytest.mark.parametrize(("env", "cpu", "cuda"), [(None, False, True), ("1", True, True), ("0", False, False)])
def test_a_worker_draws_ahead_for_accelerator_backends_unless_told(
    monkeypatch: pytest.MonkeyPatch, env: str | None, cpu: bool, cuda: bool
) -> None:
    if env is None:
        monkeypatch.delenv("PA_ORACLE_DRAW_AHEAD", raising=False)
    else:
        monkeypatch.setenv("PA_ORACLE_DRAW_AHEAD", env)
    ahead = DrawAhead()
    assert (ahead.wanted(None), ahead.wanted("cpu"), ahead.wanted("cuda")) == (cpu, cpu, cuda)


def test_a_sidecar_case_is_never_drawn_ahead(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ahead = DrawAhead(enabled=True)
    sidecar = dataclasses.replace(CASE, tensors_file=str(tmp_path / "tensors.npz"))
    ahead.prepare(sidecar)
    assert ahead.prepared == 0 and ahead.take(sidecar) is None


def judged_in_a_worker(queued: list[Case]) -> tuple[list, int]:
    """(outcomes of ``queued``, all queued at once, kernel outputs kept; how many were drawn ahead)."""
    spec = "tests.test_draw_ahead:reports_draws_ahead"
    worker = IsolatedBackend(UserKernel.from_spec(spec), spec, timeout=60, keep_output=True)
    try:
        for case in queued:
            worker.submit(case)
        outcomes = [worker.collect()[0] for _ in queued]
        worker.submit(dataclasses.replace(CASE, heads=Heads(REPORT_HEADS, 1, 8, 8)))
        report = worker.collect()[0]
    finally:
        worker.close()
    assert report.status == "unsupported" and report.message.startswith("NotImplementedError: draws taken: ")
    return outcomes, int(report.message.rsplit(" ", 1)[1])


def test_the_worker_draws_queued_cases_ahead_and_judges_the_same_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PA_ORACLE_DRAW_AHEAD", "1")  # the worker reads it when it starts; a CPU kernel needs it on
    kernel = UserKernel.from_spec("tests.test_draw_ahead:reports_draws_ahead")
    queued = [dataclasses.replace(CASE, seed=seed) for seed in range(6)]
    outcomes, taken = judged_in_a_worker(queued)
    # the first is never drawn ahead, and a case that reaches the pipe after its predecessor's turn began is not
    # either (a loaded CI machine: 4 of 6 once): the values drawn ahead are what must not differ
    assert taken >= len(queued) // 2, f"only {taken} of the {len(queued)} queued cases were drawn ahead"
    for case, outcome in zip(queued, outcomes):
        here = check_case(kernel, case, keep_output=True)
        assert outcome.status == here.status == "pass", outcome.message
        assert outcome.output is not None and here.output is not None
        assert torch.equal(outcome.output.out, here.output.out) and torch.equal(outcome.output.lse, here.output.lse)


def test_by_default_a_worker_does_not_draw_ahead_for_a_cpu_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PA_ORACLE_DRAW_AHEAD", raising=False)
    outcomes, taken = judged_in_a_worker([dataclasses.replace(CASE, seed=seed) for seed in range(3)])
    assert taken == 0 and all(outcome.status == "pass" for outcome in outcomes)


def test_a_case_taking_the_draw_of_another_with_its_key_plans_its_own_buckets() -> None:
    # the worker prepares the next queued case while the current one (never prepared) is judged:
    # when both have one draw key, the current one takes the next one's draw (the same values),
    # never its bucket plan (made for its options: here non-causal, where the current one is causal)
    ahead = DrawAhead(enabled=True)
    causal = dataclasses.replace(CASE, options=dataclasses.replace(CASE.options, causal=True))
    ahead.prepare(CASE)
    assert ahead.take(causal) is not None
    assert ahead.take_plan(causal) is None, "a plan made for another case object"
