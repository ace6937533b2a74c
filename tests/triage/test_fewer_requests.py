"""The campaign drops the requests a finding does not need before it saves and prints it."""

from __future__ import annotations

from functools import partial

from pa_oracle.fuzz.campaign.minimize import fewer_requests
from pa_oracle.fuzz.campaign.workload import Workload, keep_requests
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import Case, Heads, Layout, Options

from .conftest import kernel


def test_irrelevant_requests_are_dropped() -> None:
    backend = kernel("nan_on_empty")
    case = Case(Layout.from_lengths([1] * 6, [0, 0, 0, 0, 0, 1], page_size=4), Heads(2, 1, 16, 16),
                Options(q_dtype="bfloat16", kv_dtype="bfloat16"), seed=1)
    found = check_case(backend, case)
    assert found.status == "fail"
    judged = []
    smaller = fewer_requests(found, lambda c: judged.append(c) or check_case(backend, c))
    assert smaller.status == "fail" and smaller.case.layout.batch_size == 1, smaller.case.summary()
    assert smaller.case.layout.kv_lens == (0,) and len(judged) <= 16


def test_a_request_the_failure_needs_is_kept_and_known_findings_are_not_shrunk_into() -> None:
    backend = kernel("last_page_off_by_one")
    case = Case(Layout.from_lengths([1, 1, 1], [0, 5, 0], page_size=4), Heads(2, 1, 16, 16), seed=2)
    found = check_case(backend, case)
    assert found.status == "fail"
    smaller = fewer_requests(found, partial(check_case, backend))
    assert smaller.case.layout.kv_lens == (5,)
    kept = fewer_requests(found, partial(check_case, backend), known=lambda c: c.layout.batch_size < 3)
    assert kept.case == case


def test_without_request_keeps_the_others_pages() -> None:
    work = Workload(Case(Layout.from_lengths([1, 2], [5, 3], page_size=4, page_order=[2, 0, 1]), Heads(1, 1, 8, 8)))
    assert keep_requests(work, [1]).case.layout.kv_indices == (1,) and keep_requests(work, [0]).case.layout.kv_indices == (2, 0)
