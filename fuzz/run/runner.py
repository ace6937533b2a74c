"""Run one case on one backend and judge it: tensors -> (oracle, control, kernel) -> verdict.

Every check a campaign runs is a ``CaseCheck`` (name, what it needs from the backend, ``judge``) that
returns one ``Outcome``; the comparison with the oracle is one of them (``ORACLE``), the
metamorphic, plan and graph checks are the others (``pa_oracle.fuzz.checks``).

The judge cannot be bypassed. A kernel that raises ``Unsupported`` or ``NotImplementedError``
skips the case; anything else it raises (any ``BaseException``: ``SystemExit``, ``GeneratorExit``,
a ``KeyboardInterrupt`` of its own) is a crash finding, and an output that breaks the contract
(not tensors, another device, a wrong count) or a write to any input (the index tensors included)
is a failing verdict. Only the user's Ctrl-C passes through: a KeyboardInterrupt raised while a
SIGINT arrived during the call (``_watch_sigint``); in an isolated worker SIGINT is ignored, so
there every KeyboardInterrupt is the kernel's.
"""

from __future__ import annotations

import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import torch
from pa_oracle.backends.base import Backend, Capabilities, ContractViolation, KernelOutput, Unsupported, exception_text
from pa_oracle.fuzz.run import boundary
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.errors import BadInput
from pa_oracle.oracle.reference import default_engine, float32_logit_noise, fp8_logit_noise, plain_controls, reference, shared_plan
from pa_oracle.oracle.tensors import Tensors, make_tensors, torch_dtype
from pa_oracle.oracle.tolerance import Tolerance, Verdict, compare

if TYPE_CHECKING:
    from pa_oracle.oracle.report import Location

# "error": the oracle itself could not judge a well-formed output (a tool failure, never a finding)
Status = Literal["pass", "fail", "crash", "unsupported", "error"]
_CRASH_SIGNS = ("illegal memory", "device-side assert", "cuda error", "segmentation", "out of bounds")
CONTRACT = "kernel contract"  # the first words of every contract-violation failure
T = TypeVar("T")


ORACLE_CHECK = "oracle"  # the name of the comparison with the oracle among the checks


@dataclass
class Outcome:
    """What one check found on one case: "pass", "fail" (a wrong output, a violated relation),
    "crash", "unsupported" (the kernel declined; a check that skipped) or "error" (the tool could
    not judge: never a finding). ``output`` is the kernel's raw output on ``case`` (on the CPU),
    kept for every failing verdict (and every judged case when asked), so triage need not run the
    kernel again; ``cases`` are what a finding of a check beyond the oracle saves (original first,
    with their tensors when they are not the seed's)."""

    case: Case
    backend: str
    status: Status
    message: str = ""
    verdict: Verdict | None = None
    output: KernelOutput | None = field(default=None, repr=False)
    check: str = ORACLE_CHECK
    cases: list[tuple[str, Case, Tensors | None]] = field(default_factory=list, repr=False)
    exact: bool | None = None  # a kernel-vs-kernel check's outputs were bit-identical (None: not such a check)
    worst: Location | None = None  # where a check's largest difference is

    @property
    def is_finding(self) -> bool:
        return self.status in ("fail", "crash")

    def on_cpu(self) -> Outcome:
        """The outcome with every tensor it carries on the host (so that it pickles without CUDA)."""
        if self.verdict is not None:
            for name, value in vars(self.verdict).items():
                if isinstance(value, torch.Tensor):
                    setattr(self.verdict, name, value.cpu())
        if self.output is not None:
            self.output = _output_on_cpu(self.output)
        self.cases = [(label, case, None if t is None else t.to("cpu")) for label, case, t in self.cases]
        return self


def _output_on_cpu(output: KernelOutput) -> KernelOutput:
    return KernelOutput(output.out.detach().cpu(), None if output.lse is None else output.lse.detach().cpu())


class CaseCheck(Protocol):
    """What a campaign runs on drawn cases: the comparison with the oracle (``OracleCheck``) or a check of
    ``pa_oracle.fuzz.checks`` (their base class is ``pa_oracle.fuzz.checks.base.Check``). It must pickle (an
    isolated worker runs it)."""

    @property
    def name(self) -> str: ...

    def capabilities(self, backend: Backend) -> Capabilities | str:
        """What to draw for ``backend`` (what the check needs from it), or why it cannot apply."""
        ...

    def judge(self, case: Case, backend: Backend, tolerance: Tolerance = Tolerance(), keep_output: bool = False) -> Outcome:
        """Run ``case`` on ``backend`` and judge it; exceptions of the tool itself propagate."""
        ...


@dataclass(frozen=True)
class OracleCheck:
    """The comparison with the float64 oracle (``check_case``)."""

    name: str = ORACLE_CHECK

    def capabilities(self, backend: Backend) -> Capabilities | str:
        return backend.capabilities

    def judge(self, case: Case, backend: Backend, tolerance: Tolerance = Tolerance(), keep_output: bool = False) -> Outcome:
        return check_case(backend, case, tolerance, keep_output)


ORACLE = OracleCheck()


def is_unsupported(exc: BaseException) -> bool:
    """FlashInfer's rule: a crash is always a finding; only explicit refusals are skips."""
    if any(sign in exception_text(exc).lower() for sign in _CRASH_SIGNS):
        return False
    return isinstance(exc, (Unsupported, NotImplementedError))


class OracleDisagreement(AssertionError):
    """The fused float64 kernel and the torch reference judged a kernel differently: a bug in the
    oracle itself, never a finding about the kernel."""


class BadEngine(BadInput):
    """``PA_ORACLE_ENGINE`` names no engine of the oracle (bad input: exit 2)."""


def engine_from_env() -> str:
    """The oracle's engine ``PA_ORACLE_ENGINE`` asks for (``auto`` when unset); ``BadEngine`` for another
    value, so that a run refuses it before it judges anything, not as every case's tool error."""
    try:
        return default_engine()
    except ValueError as exc:
        raise BadEngine(str(exc)) from None


def judge(case: Case, tensors: Tensors, result: KernelOutput, tolerance: Tolerance = Tolerance()) -> Verdict:
    """Compare a kernel's output for ``case`` on ``tensors`` with the float64 reference.

    On CUDA the reference is computed by the fused kernel (``pa_oracle.oracle.fused``); a failing verdict is
    computed again against the torch reference, the definition, which alone decides a finding.
    """
    engine_from_env()
    plan = shared_plan(case, tensors)  # the reference's buckets, the controls' too
    ref = reference(case, tensors, logit_noise=True, plan=plan)
    controls = plain_controls(case, tensors, torch_dtype(case.options.out_dtype), plan=plan)
    empty_rows = None if plan is None else plan.empty_rows  # known on the host: saves the device a pass or a wait
    lse_noise = fp8_logit_noise(case, tensors) if case.options.q_is_fp8 and result.lse is not None else None
    verdict = compare(case, out=result.out, lse=result.lse, ref=ref, controls=controls, tolerance=tolerance, empty_rows=empty_rows,
                      lse_noise=lse_noise)
    if not verdict.passed and result.lse is not None and lse_noise is None:
        # the float32 dot's rounding only widens the LSE's limit: computed for a failing verdict alone (the same verdicts)
        lse_noise = float32_logit_noise(case, tensors)
        verdict = compare(case, out=result.out, lse=result.lse, ref=ref, controls=controls, tolerance=tolerance,
                          empty_rows=empty_rows, lse_noise=lse_noise)
    if verdict.passed or ref.engine == "torch":
        return verdict
    definition = reference(case, tensors, logit_noise=True, engine="torch", plan=plan)
    again = compare(case, out=result.out, lse=result.lse, ref=definition, controls=controls, tolerance=tolerance, empty_rows=empty_rows,
                    lse_noise=lse_noise)
    if again.passed:
        raise OracleDisagreement(
            f"the fused oracle failed the kernel ({verdict.headline()}) but the torch reference passes it: "
            f"max |fused - torch| out {(ref.out - definition.out).abs().nan_to_num().max().item():.3g}; case {case.summary()}"
        )
    return again


def contract_problem(result: Any, device: torch.device) -> str | None:
    """What is wrong with a kernel's return value before any value is compared, or None: it must be
    ``(out, lse)`` with ``out`` a dense tensor and ``lse`` one or None, both on the inputs' device.
    Shapes and dtypes are the verdict's to judge (``compare``)."""
    if not isinstance(result, tuple) or len(result) != 2:
        return f"returned {_describe(result)}; expected (out, lse)"
    for name, value in zip(("out", "lse"), result):
        if value is None and name == "lse":
            continue
        if not isinstance(value, torch.Tensor):
            return f"{name} is {_describe(value)}; expected a torch.Tensor" + (" or None" if name == "lse" else "")
        if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
            return f"{name} is a tensor subclass {_describe(value)}; expected a plain torch.Tensor"
        if value.is_nested or value.is_quantized or value.layout != torch.strided:
            return f"{name} has layout {value.layout}{' (nested)' if value.is_nested else ''}{' (quantized)' if value.is_quantized else ''}; expected a dense (strided) tensor"
        if value.dtype not in _OUTPUT_DTYPES:
            return f"{name} has dtype {value.dtype}; expected one of float16, bfloat16, float32, float64"
        if value.device != device:
            return f"{name} is on {value.device}; the inputs are on {device}"
    return None


_OUTPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _describe(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return "None" if value is None else f"a {type(value).__module__}.{type(value).__qualname__}"


def check_case(backend: Backend, case: Case, tolerance: Tolerance = Tolerance(), keep_output: bool = False, *,
               elsewhere: bool = False) -> Outcome:
    """Run ``case`` on ``backend`` and compare with the float64 reference. A failing well-formed
    output is kept in the outcome (detached, on the CPU) for triage; with ``keep_output`` a
    passing one too.

    The kernel's side (``plan``, ``run``) gets a deep copy of the case and a private copy of its
    tensors; the judge keeps the case as drawn and the tensors it drew, compares the kernel's copies
    with them bit for bit after the call, and puts back (and fails the case for) whatever of the
    judge's code or torch's numerics switches the call changed (``pa_oracle.fuzz.run.boundary``). The
    judge's functions are bound here, before the call: what the kernel rebinds cannot judge its own
    case, and is named and put back after it. ``elsewhere`` (an isolated worker): the output is kept and
    not compared here; a "pass" then means only that nothing failed here, and the parent, which sent the
    case, makes the verdict (``pa_oracle.fuzz.run.isolation``)."""
    watch, judge_output, problem_of = WATCH, judge, contract_problem
    reason = backend.unsupported_reason(case)
    if reason:
        return Outcome(case, backend.name, "unsupported", reason)
    tensors = make_tensors(case, backend.device or "cpu")
    seen = boundary.case_copy(case)  # what the kernel's side is handed: its writes never reach the case judged
    settings = boundary.judge_numerics()
    in_turns = getattr(backend, "in_turns", False) is True  # the worker's judge threads: checked in the kernel's turn
    if not in_turns:
        watch.checkpoint()  # what the judge's side changed before the call is its own
    plan, raised = call_kernel(lambda: backend.plan(seen))
    given = None
    if raised is None:
        given = boundary.handed(tensors, backend.plan_inputs(plan))
        result, raised = call_kernel(lambda: finished(backend.run(plan, given.tensors), tensors.q.device))
    breaches = boundary.breaches(settings, watch, in_turns=in_turns)  # before anything of the judge runs again
    if raised is not None:
        outcome = _raised(backend, case, raised)
        if not breaches:
            return outcome
        failures = [f"{CONTRACT}: {text}" for text in breaches] + [f"and the kernel then raised: {outcome.message.splitlines()[0]}"]
        return Outcome(case, backend.name, "fail", "FAIL: " + "; ".join(failures), Verdict(False, failures))
    assert result is not None  # (nothing was raised: the call returned its output)
    problem = problem_of(result, tensors.q.device)
    if problem is None and not breaches and elsewhere:
        verdict, keep_output = Verdict(True, []), True  # compared by the parent
    elif problem is None and not breaches:
        try:
            verdict = judge_output(case, tensors, KernelOutput(*result), tolerance)
        except (OracleDisagreement, BadInput):  # the oracle's bug, the user's input (a case, PA_ORACLE_ENGINE): no verdict
            raise
        except Exception as exc:  # noqa: BLE001 - a well-formed output the oracle cannot judge: a tool failure
            return Outcome(case, backend.name, "error",
                           f"the oracle could not judge the output: {describe_exception(exc)}\n{_traceback_text(exc)}")
    else:
        verdict = Verdict(False, [f"{CONTRACT}: {text}" for text in ([problem] if problem else []) + breaches])
    assert given is not None
    changed = given.changed()
    if changed:
        verdict.passed = False
        verdict.failures.append(f"kernel modified its inputs: {', '.join(changed)}")
    kept = None
    if (keep_output or not verdict.passed) and problem is None:
        kept = _output_on_cpu(KernelOutput(*result))
    return Outcome(case, backend.name, "pass" if verdict.passed else "fail", verdict.headline(), verdict, kept)


def _raised(backend: Backend, case: Case, exc: BaseException) -> Outcome:
    if isinstance(exc, ContractViolation):
        text = exception_text(exc)
        return Outcome(case, backend.name, "fail", f"FAIL: {CONTRACT}: {text}", Verdict(False, [f"{CONTRACT}: {text}"]))
    if isinstance(exc, Exception) and is_unsupported(exc):
        return Outcome(case, backend.name, "unsupported", f"{type(exc).__name__}: {exception_text(exc)}")
    tb = _traceback_text(exc)
    why = {SystemExit: " (the kernel called sys.exit)", KeyboardInterrupt: " (raised by the kernel, not a Ctrl-C)"}
    note = next((text for kind, text in why.items() if isinstance(exc, kind)), "")
    return Outcome(case, backend.name, "crash", f"{describe_exception(exc)}{note}\n{tb}")


def describe_exception(exc: BaseException) -> str:
    """``Type: message``, or ``Type`` alone when the message is empty (``KeyboardInterrupt()``)."""
    text = exception_text(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _traceback_text(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(exc, limit=-4))
    except BaseException:  # noqa: BLE001 - formatting calls the exception's __str__ again
        return f"{type(exc).__name__} (no traceback: formatting it raised)\n"


def finished(result: T, device: torch.device) -> T:
    """``result`` once the device has run the kernel: a fault it left behind (an illegal address, reported
    asynchronously) is raised here, as the kernel's crash, and not later by the oracle's first read of the
    output, which would make it a tool error (an SGLang Triton kernel's did, H200, 2026-12-01)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result


def call_kernel(call: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    """(value, None) or (None, what the call raised); the user's Ctrl-C is re-raised. An ``os._exit`` of the
    kernel's raises (``boundary.exit_refused``): in one process it would end the run with the kernel's status."""
    with _watch_sigint() as sigint, boundary.exit_refused():
        try:
            return call(), None
        except BaseException as exc:  # noqa: BLE001 - everything a kernel raises is judged
            if isinstance(exc, KeyboardInterrupt) and sigint["arrived"]:
                raise
            return None, exc


@contextmanager
def _watch_sigint() -> Iterator[dict[str, bool]]:
    """Note whether a SIGINT (the user's Ctrl-C) arrives inside the block; its handler still runs.
    Outside the main thread no signal can arrive, so nothing is installed."""
    seen = {"arrived": False}
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is None or previous is signal.SIG_IGN:
        yield seen
        return

    def note(signum: int, frame: Any) -> None:
        seen["arrived"] = True
        if callable(previous):
            previous(signum, frame)
        else:  # SIG_DFL: Python's default is to raise KeyboardInterrupt
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, note)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


# what the judge's code is bound to: the judging modules, this one among them (``serve`` adds itself)
WATCH = boundary.Watch(boundary.judging_modules(), (torch.Tensor,))
WATCH.add(())  # recorded again with WATCH itself bound
