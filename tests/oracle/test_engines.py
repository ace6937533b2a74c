"""The oracle's engines: ``reference(engine=...)`` dispatch, and the fuzz runner's rule that only
the torch reference (the definition) decides a finding when the fused kernel computed the oracle."""

from __future__ import annotations

import pa_oracle.fuzz.run.runner as runner
import pytest
import torch
from pa_oracle.backends.base import KernelOutput
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.reference import Reference, default_engine, reference
from pa_oracle.oracle.tensors import Tensors, make_tensors

CASE = Case(Layout.from_lengths([1, 3], [9, 5], page_size=4), Heads(4, 2, 16, 16), Options(causal=True, q_dtype="bfloat16", kv_dtype="bfloat16"), seed=1)


def _kernel(tensors: Tensors, *, wrong: bool = False) -> KernelOutput:
    """A correct bf16 kernel (the reference rounded), or one with a wrong first row."""
    ref = reference(CASE, tensors, engine="torch")
    out = ref.out.clone()
    if wrong:
        out[0] += 1.0
    return KernelOutput(out.to(torch.bfloat16), ref.lse.float())


def _fused_stand_in(monkeypatch: pytest.MonkeyPatch, *, shift: float) -> list[str]:
    """Make ``pa_oracle.fuzz.run.runner.reference`` answer as the fused engine would (the torch result, its
    output shifted by ``shift``) unless asked for ``engine="torch"``; returns the engines asked for."""
    asked: list[str] = []

    def fake(case: Case, tensors: Tensors, **kwargs: object) -> Reference:
        engine = str(kwargs.pop("engine", None) or "auto")
        asked.append(engine)
        ref = reference(case, tensors, engine="torch", **kwargs)  # type: ignore[arg-type]
        return ref if engine == "torch" else ref._replace(out=ref.out + shift, engine="fused")

    monkeypatch.setattr(runner, "reference", fake)
    return asked


def test_a_passing_verdict_of_the_fused_engine_is_not_recomputed(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _fused_stand_in(monkeypatch, shift=0.0)
    tensors = make_tensors(CASE)
    assert runner.judge(CASE, tensors, _kernel(tensors)).passed
    assert asked == ["auto"]


def test_a_failure_is_decided_by_the_torch_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _fused_stand_in(monkeypatch, shift=0.0)
    tensors = make_tensors(CASE)
    verdict = runner.judge(CASE, tensors, _kernel(tensors, wrong=True))
    assert not verdict.passed
    assert asked == ["auto", "torch"]


def test_a_wrong_fused_oracle_is_an_error_not_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    # the fused result is off by 0.5 and so are the controls (else the kernel-vs-control ratio
    # absorbs it): judged against it the correct kernel fails; against the torch reference it passes
    _fused_stand_in(monkeypatch, shift=0.5)
    controls = runner.plain_controls
    monkeypatch.setattr(runner, "plain_controls", lambda *a, **k: [(o + 0.5, lse) for o, lse in controls(*a, **k)])
    tensors = make_tensors(CASE)
    with pytest.raises(runner.OracleDisagreement, match="torch reference passes it"):
        runner.judge(CASE, tensors, _kernel(tensors))


def test_engine_choice() -> None:
    tensors = make_tensors(CASE)
    assert reference(CASE, tensors).engine == "torch"  # CPU tensors: the fused kernel does not apply
    with pytest.raises(ValueError, match="engine='fused' needs CUDA"):
        reference(CASE, tensors, engine="fused")
    with pytest.raises(ValueError, match="engine must be one of"):
        reference(CASE, tensors, engine="fast")


def test_engine_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PA_ORACLE_ENGINE", "torch")
    assert default_engine() == "torch"
    monkeypatch.setenv("PA_ORACLE_ENGINE", "quick")
    with pytest.raises(ValueError, match="PA_ORACLE_ENGINE"):
        default_engine()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.gpu
def test_auto_engine_on_cuda_is_the_fused_kernel_from_its_size_and_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    from pa_oracle.oracle import reference as reference_module

    tensors = make_tensors(CASE, "cuda")
    assert reference(CASE, tensors).engine == "torch"  # fuzz-sized: below FUSED_MIN_FLOPS, nothing compiles
    monkeypatch.setattr(reference_module, "FUSED_MIN_FLOPS", 0.0)
    fast, definition = reference(CASE, tensors, logit_noise=True), reference(CASE, tensors, logit_noise=True, engine="torch")
    assert (fast.engine, definition.engine) == ("fused", "torch")
    torch.testing.assert_close(fast.out, definition.out, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(fast.lse, definition.lse, rtol=1e-12, atol=1e-13)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.gpu
def test_fused_kernel_falls_back_to_one_stage_where_the_pipeline_does_not_fit() -> None:
    """float32 KV at head dim 256: pipelined K/V tiles exceed shared memory; the result must still come."""
    pytest.importorskip("triton")
    case = Case(Layout.from_lengths([1, 70], [300, 120], page_size=16), Heads(4, 2, 256, 256), Options(causal=True, q_dtype="float32", kv_dtype="float32"), seed=4)
    tensors = make_tensors(case, "cuda")
    fast, definition = reference(case, tensors, engine="fused"), reference(case, tensors, engine="torch")
    torch.testing.assert_close(fast.out, definition.out, rtol=1e-12, atol=1e-13)
