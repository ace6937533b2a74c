"""Issue 43: minimization keeps a finding's strength. A user kernel that applies the soft cap after ALiBi fails
the output far beyond the rounding bound; its minimized case must still fail the same quantities by at least
``strength.required_ratio`` of the original's ratio, never an LSE at 1.00x."""

from __future__ import annotations

import math

import pytest
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.minimize import Signature, minimize, signature
from pa_oracle.fuzz.campaign.strength import FLOOR_RATIO, KEEP_FRACTION, Strength, kept, required_ratio, strengths
from pa_oracle.fuzz.campaign.workload import Workload
from pa_oracle.fuzz.run.runner import check_case

from .conftest import CAP_ALIBI, cap_alibi_case


def test_the_rule_keeps_a_tenth_of_the_ratio_and_at_least_twice_the_allowed_error() -> None:
    assert (KEEP_FRACTION, FLOOR_RATIO) == (0.1, 2.0)
    assert required_ratio(1804.0) == pytest.approx(180.4)
    assert required_ratio(15.0) == 2.0 and required_ratio(1.5) == 1.5 and math.isinf(required_ratio(math.inf))


def test_a_weaker_failure_or_another_quantity_is_not_the_same_failure() -> None:
    out, lse = Strength("out", "max", 0.000332, 1.84e-07), Strength("lse", "max", 8.79e-07, 8.76e-07)
    assert round(out.ratio) == 1804 and out.describe() == "out max error 0.000332 > 1.84e-07 allowed (1,804x)"
    target = Signature("fail", frozenset({"out error", "lse error"}), (out, lse))
    assert kept(target.strengths) == (out,)  # the LSE at 1.00x is not a strength to keep
    assert not target.reproduced_by(Signature("fail", frozenset({"lse error"}), (lse,)))
    assert not target.reproduced_by(Signature("fail", frozenset({"out error"}), (Strength("out", "max", 3.3e-06, 1.84e-07),)))
    assert target.reproduced_by(Signature("fail", frozenset({"out error"}), (Strength("out", "max", 3.4e-05, 1.84e-07),)))


@pytest.mark.parametrize(("dtype", "soft_cap", "seed"), [("bfloat16", 5.0, 1), ("float32", 1.0, 0), ("float16", 5.0, 0)])
def test_the_minimized_case_fails_the_same_quantities_at_least_as_the_rule_says(dtype: str, soft_cap: float, seed: int) -> None:
    backend, case = UserKernel.from_spec(CAP_ALIBI), cap_alibi_case(dtype, soft_cap, seed)
    original = strengths(check_case(backend, case).verdict)
    assert {s.quantity for s in original} == {"out", "lse"}, original
    result = minimize(backend, Workload(case), budget=300)
    assert result.reduced and result.work.case.layout.batch_size == 1, result.work.case.summary()
    found = {s.quantity: s for s in strengths(result.outcome.verdict)}
    for before in kept(original):
        after = found.get(before.quantity)
        assert after is not None, f"{before.describe()} became {result.outcome.message}"
        assert after.ratio >= max(before.ratio * KEEP_FRACTION, FLOOR_RATIO), f"{before.describe()} became {after.describe()}"
    assert signature(result.outcome).strengths == tuple(found.values())
