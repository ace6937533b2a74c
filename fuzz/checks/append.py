"""Judge one write: canary-filled pool, the kernel's append in place, byte-for-byte comparison
with ``pa_oracle.oracle.append.expected_pools``; the append tensors and index tensors must come
back unchanged. ``WRITE`` is that judgement as a check of the campaign engine (``WriteCheck``): it draws
``pa_oracle.fuzz.draw.appends.append_cases`` for a write kernel (``pa_oracle.backends.writes.WriteBackend``)
and answers each case with an ``Outcome``, as the oracle comparison does for an attention kernel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from pa_oracle.backends.base import Backend, exception_text
from pa_oracle.backends.writes import WriteBackend, WriteCapabilities, WriteKernel
from pa_oracle.fuzz.run.runner import Outcome, Status, call_kernel, finished
from pa_oracle.oracle.append import CACHE_DTYPES, DTYPES, LAYOUTS, AppendCase, AppendVerdict, compare_pools, make_inputs
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import same_bits
from pa_oracle.oracle.tolerance import Tolerance

WRITE_CHECK = "write"  # the write check's name (a state's BACKEND:write key, a finding's found_by.check)
MUTATED = "mutated: "  # how a failure for a changed input starts (the other failures: wrong bytes)


class WriteOutcome(NamedTuple):
    case: AppendCase
    kernel: str
    status: str  # "pass", "fail" (wrong bytes), "crash" (the kernel raised), "mutated" (changed its inputs)
    detail: str
    verdict: AppendVerdict | None = None

    @property
    def ok(self) -> bool:
        return self.status == "pass"


def judge_write(case: AppendCase, kernel: WriteKernel) -> WriteOutcome:
    """Whatever the kernel raises (any ``BaseException``: ``SystemExit`` too, but the user's Ctrl-C) is its crash."""
    inputs = make_inputs(case, kernel.device)
    before = inputs._replace(k_pool=inputs.k_pool.clone(), v_pool=inputs.v_pool.clone())
    read_only = {name: getattr(inputs, name).clone() for name in
                 ("append_k", "append_v", "kv_indices", "kv_indptr", "kv_last_page_len", "batch_indices", "positions",
                  "slot_mapping")}
    def write() -> None:
        kernel.append(case, inputs)
        finished(None, inputs.k_pool.device)  # a fault the device reports late is the kernel's crash too

    _, raised = call_kernel(write)
    if raised is not None:
        return WriteOutcome(case, kernel.name, "crash", f"{type(raised).__name__}: {exception_text(raised)}")
    changed = [name for name, kept in read_only.items() if not same_bits(kept, getattr(inputs, name))]
    if changed:
        return WriteOutcome(case, kernel.name, "mutated", f"the kernel changed its inputs: {', '.join(changed)}")
    verdict = compare_pools(case, before, inputs.k_pool, inputs.v_pool)
    return WriteOutcome(case, kernel.name, "pass" if verdict.ok else "fail", verdict.summary(), verdict)


def as_outcome(outcome: WriteOutcome, backend: str) -> Outcome:
    """The engine's ``Outcome`` of a judged write: "mutated" is a "fail" whose message starts ``mutated: ``.
    The write case travels in the outcome's case slot (the engine reads only ``case_id``, ``summary()``,
    ``seed`` and ``replace`` of it, which ``AppendCase`` has; ``is_write_case`` tells the kinds apart)."""
    statuses: dict[str, Status] = {"pass": "pass", "fail": "fail", "mutated": "fail", "crash": "crash"}
    status = statuses[outcome.status]
    message = MUTATED + outcome.detail if outcome.status == "mutated" else outcome.detail
    return Outcome(engine_case(outcome.case), backend, status, message, check=WRITE_CHECK)


def engine_case(case: AppendCase) -> Case:
    """``case`` where the engine's code is typed on the attention ``Case`` (its outcome's case, a judge's
    argument): the engine reads only ``case_id``, ``summary()``, ``seed`` and ``replace`` of a write case, and
    ``is_write_case`` keeps it from everything else (coverage, dropping requests, the attention finding folder)."""
    return cast(Case, case)


def is_write_case(case: object) -> bool:
    return isinstance(case, AppendCase)


def write_case(outcome: Outcome) -> AppendCase:
    """The write case an outcome of the write check carries."""
    case: object = outcome.case
    if not isinstance(case, AppendCase):
        raise TypeError(f"not a write case: {type(case).__name__}")
    return case


@dataclass(frozen=True)
class WriteCheck:
    """The write oracle as a ``CaseCheck``: what a write kernel draws (``strategy``), and its verdict."""

    name: str = WRITE_CHECK
    pipelined: bool = False  # no draw ahead (``pa_oracle.fuzz.campaign.chunks`` and the draw processes draw attention cases)

    def capabilities(self, backend: Backend) -> Any:
        """The write kernel's ``WriteCapabilities``, or why the check cannot apply (an attention kernel)."""
        if isinstance(backend, WriteBackend):
            return backend.kernel.capabilities
        return f"{backend.name} is an attention kernel: the write check judges write kernels only"

    def strategy(self, capabilities: WriteCapabilities, limits: Any = None) -> Any:
        """The cases a write kernel draws (``limits``, the attention draws' bounds, do not apply)."""
        from pa_oracle.fuzz.draw.appends import append_cases

        return append_cases(capabilities)

    def judge(self, case: Case | AppendCase, backend: Backend, tolerance: Tolerance = Tolerance(),
              keep_output: bool = False) -> Outcome:
        if not isinstance(case, AppendCase) or not isinstance(backend, WriteBackend):
            raise TypeError(f"the write check judges a write case on a write kernel, not {type(case).__name__} on {backend.name}")
        return as_outcome(judge_write(case, backend.kernel), backend.name)


WRITE = WriteCheck()


# what a ledger entry of the write check may match (``pa_oracle.fuzz.campaign.ledger``: ``matches``): a feature's
# type, or the values it takes
WRITE_FEATURES: dict[str, Any] = {
    "dtype": CACHE_DTYPES, "append_dtype": DTYPES, "kv_layout": LAYOUTS, "combined": bool, "page_size": int,
    "num_kv_heads": int, "head_dim": int, "batch_size": int, "padding": bool, "quantised": bool, "scaled": bool,
    "empty_append": bool,
}


def write_features(case: AppendCase) -> dict[str, Any]:
    """The features of a write case that ``WRITE_FEATURES`` names: ``padding`` (some padding row), ``scaled``
    (a scale other than 1), ``empty_append`` (some request appends nothing), ``append_dtype`` (the appended values')."""
    return {
        "dtype": case.dtype, "append_dtype": case.source_dtype, "kv_layout": case.kv_layout, "combined": case.combined,
        "page_size": case.page_size, "num_kv_heads": case.num_kv_heads, "head_dim": case.head_dim,
        "batch_size": case.batch_size, "padding": case.padding > 0, "quantised": case.quantised,
        "scaled": (case.k_scale, case.v_scale) != (1.0, 1.0), "empty_append": 0 in case.append_lens,
    }
