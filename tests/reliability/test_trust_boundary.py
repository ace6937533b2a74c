"""The kernel under test is untrusted code (issue 31): it writes its inputs in ways a weighted sum of their
bits cannot see, rewrites the case it is handed, flips torch's numerics switches, rebinds the judge.
Each must end in a failing verdict that names what it did (exit 1 through the CLI), the judge's own
state put back; the kernel's copies are compared with the judge's bit for bit."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pa_oracle.fuzz.run.runner as runner
import pa_oracle.oracle.tolerance as tolerance
import pytest
import torch
from click.testing import CliRunner
from pa_oracle.backends.base import Backend, Capabilities, KernelOutput
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.quality.planted import correct_attention
from pa_oracle.fuzz.run import boundary
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import Case, Heads, Layout, Options, Rope
from pa_oracle.oracle.tensors import Tensors, make_tensors, same_bits

from pa_oracle.cli import main
from tests.reliability import bad_kernels

MODULE = "tests.reliability.bad_kernels"
FP16 = Options(q_dtype="float16", kv_dtype="float16")
TWO_REQUESTS = Case(Layout.from_lengths([2, 3], [12, 12], 4), Heads(2, 1, 16, 16), FP16, seed=3)
LONG_POOL = Case(Layout.from_lengths([1], [640], 16), Heads(2, 2, 64, 64), FP16, seed=4)  # 81,920 K elements


def _kernel(name: str) -> UserKernel:
    return UserKernel.from_spec(f"{MODULE}:{name}")


WRITES = [  # (kernel, case, the input it writes)
    ("scales_q_keeping_sums", TWO_REQUESTS, "q"),
    ("scales_k_page_keeping_sums", TWO_REQUESTS, "k_cache"),
    ("swaps_k_65521_apart", LONG_POOL, "k_cache"),
    ("shares_a_page_keeping_sums", TWO_REQUESTS, "kv_indices"),
]


@pytest.mark.parametrize(("kernel", "case", "written"), WRITES, ids=[w[0] for w in WRITES])
def test_a_write_that_keeps_the_old_weighted_sums_is_a_failing_verdict(kernel: str, case: Case, written: str) -> None:
    bad_kernels.DONE.clear()
    outcome = check_case(_kernel(kernel), case)
    assert bad_kernels.DONE["sums_kept"] is True, "the write must be one the old fingerprint could not see"
    assert outcome.status == "fail" and f"kernel modified its inputs: {written}" in outcome.message, outcome.message
    # the judge's reference comes from its own copy: the kernel's answer on what it wrote is wrong against it
    assert outcome.verdict is not None and outcome.verdict.out is not None and outcome.verdict.out.ratio > 1, outcome.message


def test_the_kernel_is_handed_a_copy_and_the_judge_keeps_the_tensors_it_drew() -> None:
    seen: dict[str, Tensors] = {}

    class Keeps(Backend):
        name = "keeps-its-tensors"
        capabilities = Capabilities(devices=("cpu",), alibi=False, sinks=False, fp8_scales=False)

        def run(self, plan: Any, tensors: Tensors) -> KernelOutput:
            seen["tensors"] = tensors
            tensors.q.zero_()  # a write to every element of its copy
            return _correct(plan, tensors)

    outcome = check_case(Keeps(), TWO_REQUESTS)
    drawn = make_tensors(TWO_REQUESTS)
    assert outcome.status == "fail" and "kernel modified its inputs: q" in outcome.message, outcome.message
    assert not same_bits(seen["tensors"].q, drawn.q) and bool((seen["tensors"].q == 0).all())


def _correct(case: Case, tensors: Tensors) -> KernelOutput:
    lay, opts = case.layout, case.options
    out, lse = correct_attention(
        tensors.q, tensors.k_cache, tensors.v_cache, qo_indptr=torch.tensor(lay.qo_indptr), kv_indptr=torch.tensor(lay.kv_indptr),
        kv_indices=torch.tensor(lay.kv_indices), kv_last_page_len=torch.tensor(lay.kv_last_page_len), causal=opts.causal,
        sm_scale=case.sm_scale, window_left=opts.window_left, logits_soft_cap=opts.logits_soft_cap,
    )
    return KernelOutput(out, lse)


def test_a_kernel_that_sets_its_ropes_scale_to_one_is_judged_with_the_case_as_drawn() -> None:
    case = Case(Layout.from_lengths([3, 2], [9, 14], 4), Heads(2, 1, 16, 16), Options(rope=Rope(scale=4.0)), seed=2)
    bad_kernels.DONE.clear()
    outcome = check_case(_kernel("rope_scale_to_one"), case)
    assert bad_kernels.DONE["rope"].scale == 1.0, "the kernel did rewrite the rope it was handed"
    assert bad_kernels.DONE["rope"] is not case.options.rope and case.options.rope.scale == 4.0
    assert outcome.status == "fail" and outcome.verdict.out.ratio > 10, outcome.message  # ignoring scale=4: far off
    assert check_case(_kernel("rope_scale_to_one"), case.replace(options=Options(rope=Rope(scale=1.0)))).status == "pass"


def test_a_backend_that_rewrites_the_options_of_its_case_is_judged_with_the_case_as_drawn() -> None:
    class FlipsCausal(Backend):
        name = "flips-causal"
        capabilities = Capabilities(devices=("cpu",), alibi=False, sinks=False, fp8_scales=False)

        def run(self, plan: Any, tensors: Tensors) -> KernelOutput:
            object.__setattr__(plan.options, "causal", not plan.options.causal)
            return _correct(plan, tensors)

    case = Case(Layout.from_lengths([4, 3], [9, 14], 4), Heads(2, 1, 16, 16), Options(causal=True), seed=5)
    outcome = check_case(FlipsCausal(), case)
    assert case.options.causal is True
    assert outcome.status == "fail" and outcome.verdict.out.ratio > 10, outcome.message


def test_a_kernel_that_changes_torchs_numerics_during_its_call_fails_and_they_are_put_back() -> None:
    before = boundary.numerics()
    try:
        outcome = check_case(_kernel("sets_default_dtype_and_matmul_precision"), TWO_REQUESTS)
        assert torch.get_default_dtype() == torch.float32 and torch.get_float32_matmul_precision() == "highest"
        assert boundary.numerics() == before
    finally:
        boundary.restore_numerics(before)
    assert outcome.status == "fail" and "the kernel changed torch's numerics switches during its call" in outcome.message, outcome.message
    assert "torch.get_default_dtype() torch.float32 -> torch.float64" in outcome.message, outcome.message
    assert "torch.get_float32_matmul_precision() 'highest' -> 'medium'" in outcome.message, outcome.message
    assert "put back before the reference and the controls were computed" in outcome.message
    assert check_case(_kernel("correct"), TWO_REQUESTS).status == "pass"


def test_numerics_a_library_sets_outside_a_call_are_the_judges_not_a_finding() -> None:
    before = boundary.numerics()
    try:
        torch.set_float32_matmul_precision("high")  # as an import may: the process's setting, before any call
        assert check_case(_kernel("correct"), TWO_REQUESTS).status == "pass"
    finally:
        boundary.restore_numerics(before)
    assert boundary.numerics() == before


SWAPS = [  # (kernel, what the failure names)
    ("swaps_judge_rebound", "pa_oracle.fuzz.run.runner.judge"),
    ("swaps_compare_rebound", "pa_oracle.fuzz.run.runner.compare"),
    ("swaps_judge_code_swapped", "pa_oracle.fuzz.run.runner.judge.__code__"),
    ("swaps_verdict_always_passes", "pa_oracle.oracle.tolerance.Verdict.passed"),
    ("swaps_check_case_rebound", "pa_oracle.fuzz.run.runner.check_case"),
    ("swaps_tensor_abs_zero", "torch.Tensor.abs"),
]


@pytest.fixture
def judge_as_imported():  # type: ignore[no-untyped-def]
    """The judge's bindings before the test, put back after it whatever happens (a failed put-back must not
    leak into later tests)."""
    kept = (runner.judge, runner.compare, runner.check_case, tolerance.compare, runner.judge.__code__, torch.Tensor.abs)
    yield kept
    runner.judge, runner.compare, runner.check_case, tolerance.compare = kept[:4]
    runner.judge.__code__ = kept[4]
    torch.Tensor.abs = kept[5]
    if "passed" in vars(tolerance.Verdict):
        del tolerance.Verdict.passed


@pytest.mark.parametrize(("kernel", "named"), SWAPS, ids=[s[0] for s in SWAPS])
def test_a_kernel_that_swaps_the_judge_fails_and_the_judge_is_put_back(kernel: str, named: str, judge_as_imported: tuple) -> None:
    outcome = check_case(_kernel(kernel), TWO_REQUESTS)
    now = (runner.judge, runner.compare, runner.check_case, tolerance.compare, runner.judge.__code__, torch.Tensor.abs)
    assert all(a is b for a, b in zip(now, judge_as_imported)) and "passed" not in vars(tolerance.Verdict), "not put back"
    assert outcome.status == "fail" and "the kernel changed the judge: " in outcome.message and named in outcome.message, outcome.message
    halved = check_case(_kernel("correct"), TWO_REQUESTS)
    assert halved.status == "pass", halved.message  # the judge works again for the next case


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "in-process"])
def test_the_cli_finds_a_kernel_that_swaps_the_judge(tmp_path: Path, isolate: bool, judge_as_imported: tuple) -> None:
    args = ["fuzz", "--kernel", f"{MODULE}:swaps_judge_rebound", "-n", "5", "--max-batch", "2", "--max-kv-len", "12",
            "--out", str(tmp_path), *([] if isolate else ["--no-isolate"])]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert "the kernel changed the judge: pa_oracle.fuzz.run.runner.judge" in result.output, result.output


def test_the_cli_finds_a_write_the_old_fingerprint_missed_in_a_worker(tmp_path: Path) -> None:
    args = ["fuzz", "--kernel", f"{MODULE}:scales_q_keeping_sums", "-n", "5", "--max-batch", "2", "--max-kv-len", "12",
            "--out", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert "kernel modified its inputs: q" in result.output, result.output


def test_the_watch_names_what_a_call_changed_and_puts_it_back() -> None:
    import types

    module = types.ModuleType("pa_oracle.watched_by_a_test")
    exec("def f(x=1):\n    return x\nclass C:\n    def m(self):\n        return 1\nLIMIT = 2.0\n", vars(module))
    module.C.__module__ = module.__name__
    watch = boundary.Watch([module])
    f, m = module.f, module.C.m
    assert watch.tampered() == []
    module.f.__defaults__ = (5,)
    module.C.extra = property(lambda self: 0)
    module.LIMIT = 1e9
    expected = {"pa_oracle.watched_by_a_test.LIMIT", "pa_oracle.watched_by_a_test.C.extra", "pa_oracle.watched_by_a_test.f.__defaults__"}
    assert set(watch.tampered()) == expected
    watch.put_back()
    assert watch.tampered() == [] and module.f() == 1 and module.LIMIT == 2.0 and not hasattr(module.C, "extra") and module.C.m is m
    copy.deepcopy(module.C())  # copyreg's cache on the class is no tampering
    assert watch.tampered() == [] and module.f is f
    module.LIMIT = 3.0  # changed outside a kernel call (a caller, a test's monkeypatch): the judge's own
    watch.checkpoint()
    assert watch.tampered() == [] and module.LIMIT == 3.0


# --- outputs copied when returned: a kernel writing one buffer per shape (as a captured CUDA graph does)

REUSING_CASE = Case(
    Layout.from_lengths([1, 4, 4, 0], [23, 9, 2, 6], 4, page_order=[5, 9, 0, 12, 2, 8, 1, 13, 7, 3, 4, 6, 10, 11], extra_pages=2),
    Heads(4, 2, 16, 16), Options(q_dtype="float32", kv_dtype="float32"), seed=11,
)


@pytest.mark.parametrize("relation", ["reorder", "relabel", "alone", "merge"])
def test_a_correct_kernel_reusing_its_output_buffer_holds_every_relation(relation: str) -> None:
    from pa_oracle.fuzz.checks.metamorphic import RELATIONS

    bad_kernels.REUSED.clear()
    outcome = next(r for r in RELATIONS if r.name == relation)(_kernel("reuses_one_output_buffer"), REUSING_CASE)
    assert max(calls for *_, calls in bad_kernels.REUSED.values()) >= 2, "no buffer was written twice: nothing tested"
    assert outcome.status == "pass", outcome.message


def test_a_relabel_violation_is_not_hidden_by_a_reused_output_buffer() -> None:
    from pa_oracle.fuzz.checks.metamorphic import RELATIONS

    relabel = next(r for r in RELATIONS if r.name == "relabel")
    bad_kernels.REUSED.clear()
    outcome = relabel(_kernel("reuses_a_buffer_and_reads_page_labels"), REUSING_CASE)
    assert max(calls for *_, calls in bad_kernels.REUSED.values()) >= 3  # twice on the case, once relabeled: one buffer
    assert outcome.status == "fail" and "expected bit-exact outputs" in outcome.message, outcome.message


def test_the_checks_cli_passes_a_correct_kernel_that_reuses_its_output_buffer(tmp_path: Path) -> None:
    args = ["metamorphic", "-k", f"{MODULE}:reuses_one_output_buffer", "-c", "reorder", "-c", "relabel", "-c", "alone", "-c", "merge",
            "-n", "8", "--out", str(tmp_path), "--only", "max_qo_len=4"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0 and "VIOLATED" not in result.output, result.output
    assert all(f"{name}: ok" in result.output for name in ("reorder", "relabel", "alone", "merge")), result.output


# --- settings the user gives that no run can use: refused with exit 2 before anything is judged

SMALL_RUN = ["-n", "3", "--max-batch", "2", "--max-kv-len", "12"]


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "in-process"])
def test_a_bad_oracle_engine_is_bad_input_before_anything_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolate: bool) -> None:
    monkeypatch.setenv("PA_ORACLE_ENGINE", "quick")
    args = ["fuzz", "--kernel", f"{MODULE}:correct", *SMALL_RUN, "--out", str(tmp_path), *([] if isolate else ["--no-isolate"])]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "PA_ORACLE_ENGINE must be one of ('auto', 'torch', 'fused'), got 'quick'" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "summary.json").exists()


def test_a_bad_oracle_engine_is_bad_input_for_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case_path = TWO_REQUESTS.save(tmp_path / "case.json")
    monkeypatch.setenv("PA_ORACLE_ENGINE", "")
    result = CliRunner().invoke(main, ["replay", str(case_path), "-k", f"{MODULE}:correct"])
    assert result.exit_code == 2 and "PA_ORACLE_ENGINE must be one of" in result.output, result.output
    monkeypatch.setenv("PA_ORACLE_ENGINE", "torch")
    assert CliRunner().invoke(main, ["replay", str(case_path), "-k", f"{MODULE}:correct"]).exit_code == 0


def test_a_judge_meeting_a_bad_engine_raises_bad_input_not_a_tool_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from pa_oracle.fuzz.run.runner import BadEngine

    monkeypatch.setenv("PA_ORACLE_ENGINE", "fast")
    with pytest.raises(BadEngine, match="got 'fast'"):
        check_case(_kernel("correct"), TWO_REQUESTS)


@pytest.mark.parametrize("seconds", ["1e9", "86401"])
def test_a_case_timeout_past_a_day_is_bad_input(tmp_path: Path, seconds: str) -> None:
    result = CliRunner().invoke(main, ["fuzz", "--kernel", f"{MODULE}:correct", *SMALL_RUN, "--out", str(tmp_path), "--case-timeout", seconds])
    assert result.exit_code == 2, result.output
    assert f"the case timeout must be at most 86400 seconds (a day), got {float(seconds)!r}" in result.output, result.output
    assert "OverflowError" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("threads", [1, 2])
def test_in_a_worker_judging_side_by_side_the_tampering_case_fails_and_no_other(threads: int) -> None:
    from pa_oracle.fuzz.run.isolation import Worker
    from pa_oracle.fuzz.run.runner import ORACLE

    spec = f"{MODULE}:sabotages_the_judge_on_many_pages"
    few = [Case(Layout.from_lengths([q], [kv], 256), Heads(8, 2, 64, 64), seed=s) for s, (q, kv) in enumerate([(64, 256), (1, 200), (7, 100)])]
    many = Case(Layout.from_lengths([1], [40], 4), Heads(1, 1, 8, 8))
    cases = [few[0], few[1], many, few[2], few[0].replace(seed=9)]
    kernel = _kernel("sabotages_the_judge_on_many_pages")
    worker = Worker(timeout=120, threads=threads)
    try:
        for case in cases:
            worker.submit(spec, kernel.capabilities, case, ORACLE, False)
        outcomes = [worker.collect()[0] for _ in cases]
    finally:
        worker.close()
    assert [o.case.case_id for o in outcomes] == [c.case_id for c in cases]
    assert [o.status for o in outcomes] == ["pass", "pass", "fail", "pass", "pass"], [o.message for o in outcomes]
    assert "the kernel changed the judge: pa_oracle.fuzz.run.runner.compare" in outcomes[2].message, outcomes[2].message
    assert "torch.backends.cuda.matmul.allow_tf32 False -> True" in outcomes[2].message, outcomes[2].message


def _in_a_turn(kernel: str, after_turn: Any = None):  # type: ignore[no-untyped-def]
    """``kernel`` as the worker's judge threads run it: plan and run in one turn of ``KernelTurns``, the
    judge's code and torch's switches recorded at its start and checked at its end; ``after_turn`` runs
    once the turn is over (what another thread's kernel, taking the next turn, may do)."""
    from pa_oracle.fuzz.run.serve import KernelLock, KernelTurns

    saved = boundary.numerics()

    def end() -> None:
        boundary.end_turn(saved, runner.WATCH)
        if after_turn is not None:
            after_turn()

    turns = KernelTurns()
    lock = KernelLock(_kernel(kernel), turns, None, end)
    lock.judging(1, turns.ticket())
    return lock


def test_in_a_kernels_turn_what_it_changed_is_named_and_put_back(judge_as_imported: tuple) -> None:
    before = boundary.numerics()
    try:
        outcome = check_case(_in_a_turn("sabotages_the_judge_on_many_pages"), Case(Layout.from_lengths([1], [40], 4), Heads(1, 1, 8, 8)))
        assert runner.compare is judge_as_imported[1] and boundary.numerics() == before
    finally:
        boundary.restore_numerics(before)
    assert outcome.status == "fail" and "the kernel changed the judge: pa_oracle.fuzz.run.runner.compare" in outcome.message, outcome.message
    assert "torch.backends.cuda.matmul.allow_tf32 False -> True" in outcome.message


def test_what_another_threads_kernel_changes_after_the_turn_is_not_this_cases(judge_as_imported: tuple) -> None:
    before = boundary.numerics()

    def another_kernel() -> None:  # runs in the next turn, while this case is judged
        torch.backends.cuda.matmul.allow_tf32 = True

    try:
        outcome = check_case(_in_a_turn("correct", another_kernel), TWO_REQUESTS)
    finally:
        boundary.restore_numerics(before)
    assert outcome.status == "pass", outcome.message


def test_inputs_too_large_to_copy_on_their_device_are_kept_on_the_host_and_compared_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boundary, "DEVICE_COPY_LIMIT", 0)
    monkeypatch.setattr(boundary, "COMPARE_CHUNK", 64)  # bytes: many chunks
    given = boundary.handed(make_tensors(LONG_POOL), {"kv_indices": torch.tensor(LONG_POOL.layout.kv_indices, dtype=torch.int32)})
    assert given.changed() == []
    given.tensors.k_cache.view(-1)[-1] = 7.0  # the last element: the last chunk
    given.inputs["kv_indices"][0] += 1
    assert given.changed() == ["k_cache", "kv_indices"]
    bad_kernels.DONE.clear()
    outcome = check_case(_kernel("swaps_k_65521_apart"), LONG_POOL)
    assert bad_kernels.DONE["sums_kept"] is True
    assert outcome.status == "fail" and "kernel modified its inputs: k_cache" in outcome.message, outcome.message


def test_a_library_wrapping_its_own_function_during_a_call_is_no_tampering() -> None:
    seed = torch.manual_seed
    try:
        outcome = check_case(_kernel("wraps_manual_seed_as_torch_compile_does"), TWO_REQUESTS)
        assert outcome.status == "pass", outcome.message
        assert torch.manual_seed.__wrapped__ is seed, "the library's wrapper was put back"
        assert check_case(_kernel("correct"), TWO_REQUESTS).status == "pass"
    finally:
        torch.manual_seed = seed


@pytest.mark.parametrize("relation", ["reorder", "alone"])
def test_a_kernel_that_swaps_the_judge_in_a_metamorphic_check_fails_it(relation: str, judge_as_imported: tuple) -> None:
    from pa_oracle.fuzz.checks.metamorphic import RELATIONS

    check = next(r for r in RELATIONS if r.name == relation)
    outcome = check.judge(REUSING_CASE, _kernel("swaps_judge_rebound"))  # half the right output on every call: consistent
    assert runner.judge is judge_as_imported[0]
    assert outcome.status == "fail" and "the kernel changed the judge: pa_oracle.fuzz.run.runner.judge" in outcome.message, outcome.message
    assert check.judge(REUSING_CASE, _kernel("correct")).status == "pass"


def test_a_metamorphic_checks_kernel_calls_get_copies_of_the_judges_tensors() -> None:
    from pa_oracle.fuzz.checks.base import run_supported

    tensors = make_tensors(TWO_REQUESTS)
    kept = tensors.copy()
    run_supported(_kernel("writes_q"), TWO_REQUESTS, tensors, "original")
    assert same_bits(tensors.q, kept.q), "the kernel's write reached the judge's tensors"


def test_inputs_compared_on_a_device_are_read_back_together_and_find_each_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path a CUDA device takes (flags reduced where the tensors are, one read-back), run on the CPU."""
    monkeypatch.setattr(boundary, "COMPARE_CHUNK", 64)
    pool = make_tensors(LONG_POOL).k_cache.clone()
    pool.view(-1)[100] = float("nan")  # poison, as in every unreferenced slot
    nan_payload = pool.clone()
    nan_payload.view(torch.int16).view(-1)[100] ^= 1  # another NaN: the same value to ==, other bits
    last = pool.clone()
    last.view(-1)[-1] = 0.5
    indices = torch.arange(9, dtype=torch.int32)
    pairs = [("same", pool.clone(), pool), ("nan", nan_payload, pool), ("last", last, pool), ("shape", pool[:1].clone(), pool),
             ("empty", torch.zeros(0), torch.zeros(0)), ("indices", indices + (indices == 8), indices)]
    assert boundary.differing(pairs, batched=True) == ["nan", "last", "shape", "indices"]
    assert boundary.differing(pairs) == ["nan", "last", "shape", "indices"]
