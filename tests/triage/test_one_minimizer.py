"""The campaign's step after Hypothesis and triage's minimization are one minimizer: the same
ddmin over requests, the same notion of the same failure, ledger entries avoided by both."""

from __future__ import annotations

from functools import partial
from itertools import takewhile

import pytest
import torch
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.drawers import KnownFindings
from pa_oracle.fuzz.campaign.ledger import Entry
from pa_oracle.fuzz.campaign.minimize import CAMPAIGN_RUNS, fewer_requests, minimize, signature, size, smaller
from pa_oracle.fuzz.campaign.workload import Workload, keep_requests
from pa_oracle.fuzz.quality import planted
from pa_oracle.fuzz.run.runner import Outcome, check_case
from pa_oracle.oracle.case import Case, Heads, Layout, Options

from .conftest import kernel, mixed_case


def five_requests(kv_lens: list[int]) -> Case:
    layout = Layout.from_lengths([1, 2, 1, 3, 1], kv_lens, page_size=4, page_order=None, extra_pages=1)
    return Case(layout, Heads(4, 2, 16, 16), Options(q_dtype="bfloat16", kv_dtype="bfloat16"), seed=3)


def spy(backend: UserKernel, judged: list[Outcome]):  # type: ignore[no-untyped-def]
    def judge(case: Case) -> Outcome:
        judged.append(check_case(backend, case))
        return judged[-1]
    return judge


@pytest.mark.parametrize(("bug", "kv_lens"), [("last_page_off_by_one", [0, 3, 8, 6, 0]),
                                              ("nan_on_empty", [4, 3, 0, 6, 1]),
                                              ("wrong_gqa_map", [5, 3, 9, 6, 2])])
def test_the_campaigns_step_is_triages_first_stage_with_a_small_budget(bug: str, kv_lens: list[int]) -> None:
    backend, case = kernel(bug), five_requests(kv_lens)
    found = check_case(backend, case)
    assert found.is_finding, found.message
    judged: list[Outcome] = []
    campaign = fewer_requests(found, spy(backend, judged))
    requests_only = minimize(backend, Workload(case), budget=CAMPAIGN_RUNS + 1, passes=("requests",))
    assert campaign.case == requests_only.work.case and len(judged) == requests_only.runs - 1
    assert campaign.case.layout.batch_size < case.layout.batch_size, campaign.case.summary()
    assert signature(found).reproduced_by(signature(campaign)), campaign.message
    full = minimize(backend, Workload(case), budget=40)
    first_stage = list(takewhile(lambda step: step.kind == "requests", full.steps))
    assert first_stage and first_stage[-1].summary == campaign.case.summary()
    assert full.signature == signature(found) and len(full.work.case.layout.kv_lens) <= campaign.case.layout.batch_size


def test_a_candidate_a_ledger_entry_covers_is_never_chosen() -> None:
    backend = kernel("nan_on_empty")
    case = Case(Layout.from_lengths([1] * 6, [0, 0, 0, 0, 0, 1], page_size=4), Heads(2, 1, 16, 16),
                Options(q_dtype="bfloat16", kv_dtype="bfloat16"), seed=1)
    entry = Entry("planted_nan_on_empty", (backend.name,), {}, "tolerated", "a known class: one or two requests",
                  "https://github.com/flashinfer-ai/flashinfer/issues/4051", matches={"batch_size": (1, 2)})
    known = KnownFindings((entry,), backend.name, (), backend.kernel_family, "oracle")
    found = check_case(backend, case)
    judged: list[Outcome] = []
    campaign = fewer_requests(found, spy(backend, judged), known)
    assert campaign.case.layout.batch_size == 3 and not known(campaign.case), campaign.case.summary()
    assert judged and not any(known(outcome.case) for outcome in judged)
    assert fewer_requests(found, partial(check_case, backend)).case.layout.batch_size == 1  # unknown: down to one
    triaged = minimize(backend, Workload(case), known=known)
    assert triaged.work.case.layout.batch_size == 3 and not known(triaged.work.case), triaged.work.case.summary()


def _gqa_bug_but_alone(alone: str):  # type: ignore[no-untyped-def]
    """``wrong_gqa_map``, except that a batch of one request fails another way (``alone``)."""
    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,  # type: ignore[no-untyped-def]
               window_left, logits_soft_cap):
        out, lse = planted.wrong_gqa_map(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                                         kv_indices=kv_indices, kv_last_page_len=kv_last_page_len, causal=causal,
                                         sm_scale=sm_scale, window_left=window_left, logits_soft_cap=logits_soft_cap)
        if len(qo_indptr) == 2 and alone == "crash":
            raise RuntimeError("a batch of one")
        if len(qo_indptr) == 2:
            out = torch.full_like(out, float("nan"))  # the same status, another failure: non-finite output
        return out, lse
    return kernel


@pytest.mark.parametrize("alone", ["crash", "non-finite out"])
def test_a_candidate_that_fails_another_way_is_not_taken(alone: str) -> None:
    backend = UserKernel(_gqa_bug_but_alone(alone), name=f"gqa-alone-{alone.replace(' ', '-')}")
    case = five_requests([5, 3, 9, 6, 2])
    found = check_case(backend, case)
    assert found.status == "fail", found.message
    judged: list[Outcome] = []
    campaign = fewer_requests(found, spy(backend, judged))
    alone_outcomes = [o for o in judged if o.case.layout.batch_size == 1]
    assert alone_outcomes and all(o.is_finding and not signature(found).reproduced_by(signature(o)) for o in alone_outcomes)
    assert campaign.case.layout.batch_size == 2 and signature(found).reproduced_by(signature(campaign)), campaign.message
    triaged = minimize(backend, Workload(case), budget=40)
    assert triaged.work.case.layout.batch_size == 2 and triaged.signature.reproduced_by(signature(triaged.outcome))


@pytest.mark.parametrize("case", [five_requests([5, 3, 9, 6, 2]), mixed_case()], ids=["pages in order", "shuffled"])
def test_dropping_requests_is_always_smaller(case: Case) -> None:
    work = Workload(case)  # in order: the requests after a dropped one keep pages that no longer start at 0
    batch = case.layout.batch_size
    for keep in [[b for b in range(batch) if b != drop] for drop in range(batch)] + [[batch - 1]]:
        candidate = keep_requests(work, keep)
        assert smaller(candidate, work), (keep, size(candidate), size(work))
