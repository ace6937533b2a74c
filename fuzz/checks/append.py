"""Judge one write: canary-filled pool, the kernel's append in place, byte-for-byte comparison
with ``pa_oracle.oracle.append.expected_pools``; the append tensors and index tensors must come
back unchanged. ``WRITE`` is that judgement as a check of the campaign engine (``WriteCheck``): it draws
``pa_oracle.fuzz.draw.appends.append_cases`` for a write kernel (``pa_oracle.backends.writes.WriteBackend``)
and answers each case with an ``Outcome``, as the oracle comparison does for an attention kernel."""

from __future__ import annotations

import pickle
import sys
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import numpy as np
import torch

from pa_oracle.backends.base import Backend, exception_text
from pa_oracle.backends.writes import WriteBackend, WriteCapabilities, WriteKernel
from pa_oracle.fuzz.run import boundary
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
    """Whatever the kernel raises (any ``BaseException``: ``SystemExit`` too, but the user's Ctrl-C) is its crash.

    The trust boundary (``pa_oracle.fuzz.run.boundary``) as for an attention kernel: the kernel's side gets a
    copy of the case; the judge keeps the case pickled (bytes: nothing the kernel does changes them) and
    judges the case read back from them. No copy of what the pools held exists during the call: the expected pools
    and the read-only tensors are drawn again from the case after it, so a kernel that writes into every
    tensor it can find (``gc``) cannot write into them. The judge reads the pools through views of its own
    (a kernel that points its tensors at other memory, ``set_``, leaves the memory it was handed as it
    was). What the call changed of the judge's code or torch's numerics switches fails the case, put back
    before the judge runs."""
    compare, draw, watch = compare_pools, make_inputs, _WATCH  # bound before the call
    drawn = pickle.dumps(case, protocol=pickle.HIGHEST_PROTOCOL)  # bytes: nothing the kernel does changes them
    inputs = draw(case, kernel.device)
    pools = _alias(inputs.k_pool), _alias(inputs.v_pool)
    seen, settings = pickle.loads(drawn), boundary.judge_numerics()  # the kernel's side gets a copy of the case
    watch.checkpoint()

    def write() -> Any:
        with boundary.exit_refused():
            result: object = cast(Any, kernel.append)(seen, inputs)  # (a subclass's may return something: a contract breach)
            finished(None, inputs.k_pool.device)  # a fault the device reports late is the kernel's crash too
        return result

    result, raised = call_kernel(write)
    breaches = boundary.breaches(settings, watch)  # before anything of the judge runs again
    judged: AppendCase = pickle.loads(drawn)
    if not all(_same_case(c, drawn) for c in (case, seen)):
        breaches.append("the kernel changed the case it was given (judged as drawn)")
    if raised is not None:
        text = f"{type(raised).__name__}: {exception_text(raised)}"
        if not breaches:
            return WriteOutcome(judged, kernel.name, "crash", text)
        return WriteOutcome(judged, kernel.name, "fail", "; ".join([*breaches, f"and the kernel then raised: {text}"]))
    if breaches:
        return WriteOutcome(judged, kernel.name, "fail", "; ".join(breaches))
    if result is not None:
        return WriteOutcome(judged, kernel.name, "crash", f"{kernel.name} returned a {type(result).__name__}; a write kernel "
                            "writes its pools in place and returns None")
    before = draw(judged, "cpu")  # the inputs as handed, drawn again (the same bits: ``make_inputs`` is seeded)
    changed = [name for name in _READ_ONLY if not same_bits(getattr(inputs, name), getattr(before, name))]
    changed += [f"{name} (its tensor no longer views the memory it was handed, or that memory shrank)" for name, handed, own in
                zip(("k_pool", "v_pool"), (inputs.k_pool, inputs.v_pool), pools) if not _aliases(handed, own)]
    if changed:
        return WriteOutcome(judged, kernel.name, "mutated", f"the kernel changed its inputs: {', '.join(changed)}")
    verdict = compare(judged, before, *pools)
    return WriteOutcome(judged, kernel.name, "pass" if verdict.ok else "fail", verdict.summary(), verdict)


_READ_ONLY = ("append_k", "append_v", "kv_indices", "kv_indptr", "kv_last_page_len", "batch_indices", "positions", "slot_mapping")


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor of the judge's over the memory of ``t`` (what the kernel does to ``t`` itself, ``set_``, does not move it)."""
    return t.as_strided(t.size(), t.stride(), t.storage_offset())


def _aliases(handed: torch.Tensor, own: torch.Tensor) -> bool:
    """Whether the kernel's tensor still views the judge's memory, which still holds all of it (a storage
    resized smaller, ``untyped_storage().resize_``, does not)."""
    end = own.storage_offset() + sum((n - 1) * s for n, s in zip(own.size(), own.stride())) + 1
    return ((handed.data_ptr(), handed.size(), handed.stride(), handed.dtype) == (own.data_ptr(), own.size(), own.stride(), own.dtype)
            and own.untyped_storage().nbytes() >= end * own.element_size())


def _same_case(case: object, drawn: bytes) -> bool:
    """Whether ``case`` pickles to ``drawn`` (one the kernel made unpicklable does not)."""
    try:
        return pickle.dumps(case, protocol=pickle.HIGHEST_PROTOCOL) == drawn
    except Exception:  # noqa: BLE001 - whatever the kernel put in it
        return False


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


# the judge's code (this module, the oracle's, the engine's runner) and what it names of torch, numpy
# and builtins, recorded here once everything of it is defined (``boundary.Watch``)
_WATCH = boundary.Watch([*boundary.judging_modules(), sys.modules[__name__], np], (torch.Tensor,))
