"""The plan/run contract (FlashInfer's wrappers): a plan is made once per layout and reused.

- ``plan-reuse``: one plan, several tensor sets of the same layout (other seeds and data
  distributions); every run must pass the oracle. Catches a plan or wrapper that keeps data of
  an earlier run (a cached gather, a workspace that is not reset).
- ``stale-plan-pages`` / ``stale-plan-lengths``: plan for layout A, write layout B of the same
  shapes (other page ids / other kv lengths, same page counts) into the device buffers the run
  reads (``Backend.write_layout``: what an engine does between steps when it does not re-plan),
  run on B's tensors and judge against B's oracle. A wrong answer while a fresh plan for B is
  right is the finding "stale plan": the plan captured that part of the layout, so it must be
  re-planned when that changes. A right answer says the kernel reads that part at run time. An
  adapter whose plan is the case itself (the default) has no layout buffers: nothing to go
  stale, and the check says so.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from pa_oracle.backends.base import Backend, Capabilities, Unsupported
from pa_oracle.fuzz.run.runner import Outcome
from pa_oracle.fuzz.checks.base import Check, check_outcome, case_key, tensors_for
from pa_oracle.fuzz.run.runner import judge
from pa_oracle.oracle.case import DISTRIBUTIONS, Case, Layout
from pa_oracle.oracle.tensors import Tensors
from pa_oracle.oracle.tolerance import Tolerance, Verdict

REUSE_RUNS = 3


def reuse_variants(case: Case, runs: int = REUSE_RUNS) -> list[Case]:
    """``case`` and ``runs - 1`` cases of the same layout with other seeds and data distributions."""
    start = DISTRIBUTIONS.index(case.distribution)
    return [case] + [
        case.replace(seed=(case.seed + 7919 * i) % 2**31, distribution=DISTRIBUTIONS[(start + i) % len(DISTRIBUTIONS)],
                     tensors_file=None, meta={})
        for i in range(1, runs)
    ]


def _fresh(backend: Backend, case: Case, tensors: Tensors, tolerance: Tolerance) -> Verdict:
    return judge(case, tensors, backend.run(backend.plan(case), tensors.copy()), tolerance)


def _plan_reuse(backend: Backend, case: Case, tolerance: Tolerance) -> Outcome:
    reason = backend.unsupported_reason(case)
    if reason:
        raise Unsupported(reason)
    plan = backend.plan(case)
    cases: list[tuple[str, Case, Tensors | None]] = []
    for i, variant in enumerate(reuse_variants(case)):
        tensors = tensors_for(backend, variant)
        cases.append(("original" if i == 0 else f"run-{i}", variant, tensors))
        verdict = judge(variant, tensors, backend.run(plan, tensors.copy()), tolerance)
        if verdict.passed:
            continue
        if i > 0 and _fresh(backend, variant, tensors, tolerance).passed:
            message = f"run {i + 1} of {REUSE_RUNS} with one plan fails, with a fresh plan it passes: {verdict.headline()}"
        else:
            message = f"run {i + 1} fails with a fresh plan too (a plain fuzz finding): {verdict.headline()}"
        return check_outcome("plan-reuse", backend.name, "fail", message, cases)
    return check_outcome("plan-reuse", backend.name, "pass", f"{REUSE_RUNS} runs on one plan pass the oracle", cases)


def _with_pages(layout: Layout, pages: list[list[int]], last: list[int]) -> Layout:
    indptr = [0]
    for p in pages:
        indptr.append(indptr[-1] + len(p))
    flat = tuple(x for p in pages for x in p)
    return Layout(layout.qo_indptr, tuple(indptr), flat, tuple(last), layout.page_size, layout.num_pages)


def other_pages(case: Case) -> Case:
    """Layout B for ``stale-plan-pages``: the same lengths in other physical pages of the pool."""
    lay = case.layout
    if lay.num_pages < 2 or not lay.kv_indices:
        raise Unsupported("fewer than two pages: no other page table of the same shape")
    new_id = list(range(lay.num_pages))
    rng = random.Random(f"stale-pages:{case_key(case)}")
    while [new_id[p] for p in lay.kv_indices] == list(lay.kv_indices):
        rng.shuffle(new_id)
    pages = [[new_id[p] for p in lay.pages_of(b)] for b in range(lay.batch_size)]
    return case.replace(layout=_with_pages(lay, pages, list(lay.kv_last_page_len)), seed=case.seed + 1,
                        tensors_file=None, meta={})


def other_lengths(case: Case) -> Case:
    """Layout B for ``stale-plan-lengths``: every request keeps its pages (the same page table
    shape) but its last page holds another number of tokens; with one-slot pages, where that
    cannot change, a page moves from the longest request to the next one."""
    lay = case.layout
    rng = random.Random(f"stale-lengths:{case_key(case)}")
    pages = [list(lay.pages_of(b)) for b in range(lay.batch_size)]
    last = list(lay.kv_last_page_len)
    if lay.page_size > 1:
        for b, p in enumerate(pages):
            # a request whose queries all had keys keeps that (qo_len <= kv_len)
            floor = lay.qo_lens[b] - (len(p) - 1) * lay.page_size if lay.qo_lens[b] <= lay.kv_lens[b] else 1
            choices = [n for n in range(max(floor, 1), lay.page_size + 1) if n != last[b]]
            if p and choices:
                last[b] = rng.choice(choices)
    else:
        donor = max(range(lay.batch_size), key=lambda b: len(pages[b]))
        if len(pages[donor]) < 2 or lay.batch_size < 2:
            raise Unsupported("one-slot pages and no request with two pages to give one away")
        taker = (donor + 1) % lay.batch_size
        pages[taker].append(pages[donor].pop())
        last[taker] = 1
    if last == list(lay.kv_last_page_len) and [len(p) for p in pages] == list(lay.num_pages_per_request):
        raise Unsupported("no request owns a page: no other lengths of the same shape")
    return case.replace(layout=_with_pages(lay, pages, last), seed=case.seed + 1, tensors_file=None, meta={})


def _stale(kind: str, make_b: Callable[[Case], Case]) -> Callable[[Backend, Case, Tolerance], Outcome]:
    name = f"stale-plan-{kind}"

    def body(backend: Backend, case: Case, tolerance: Tolerance) -> Outcome:
        reason = backend.unsupported_reason(case)
        if reason:
            raise Unsupported(reason)
        case_b = make_b(case)
        reason = backend.unsupported_reason(case_b)
        if reason:
            raise Unsupported(f"layout B: {reason}")
        plan = backend.plan(case)
        backend.write_layout(plan, case_b)
        tensors_b = tensors_for(backend, case_b)
        cases = [("original", case, None), ("layout-b", case_b, tensors_b)]
        verdict = judge(case_b, tensors_b, backend.run(plan, tensors_b.copy()), tolerance)
        change = f"{kind} {list(case.layout.kv_lens if kind == 'lengths' else case.layout.kv_indices)} -> " + str(
            list(case_b.layout.kv_lens if kind == "lengths" else case_b.layout.kv_indices)
        )
        if verdict.passed:
            return check_outcome(name, backend.name, "pass", f"layout B read at run time ({change})", cases)
        fresh = _fresh(backend, case_b, tensors_b, tolerance)
        if fresh.passed:
            message = f"stale plan: planned for A, run on B ({change}), wrong against B's oracle: {verdict.headline()}"
        else:
            message = f"layout B fails with a fresh plan too (a plain fuzz finding): {fresh.headline()}"
        return check_outcome(name, backend.name, "fail", message, cases)

    return body


def _has_layout_buffers(backend: Backend) -> Capabilities | str:
    if type(backend).write_layout is Backend.write_layout:
        return "the plan holds the layout as host data (no device layout buffers): nothing to go stale"
    return backend.capabilities


PLAN_CHECKS = (
    Check("plan-reuse", "oracle", "a plan describes a layout, not data: every run on it must pass", _plan_reuse),
    Check("stale-plan-pages", "oracle", "reports whether the plan captured the page table",
          _stale("pages", other_pages), _has_layout_buffers),
    Check("stale-plan-lengths", "oracle", "reports whether the plan captured the kv lengths",
          _stale("lengths", other_lengths), _has_layout_buffers),
)
