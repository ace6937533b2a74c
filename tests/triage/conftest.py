from __future__ import annotations

from pathlib import Path

import pytest
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.engine import save_finding
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import Case, Heads, Layout, Options

PLANTED = "pa_oracle.fuzz.quality.planted:{}"


def kernel(name: str) -> UserKernel:
    return UserKernel.from_spec(PLANTED.format(name))


def mixed_case(**options) -> Case:
    """Three requests (full and partial last pages), shuffled pages with two unused, GQA 4/2."""
    layout = Layout.from_lengths([2, 1, 3], [9, 8, 13], page_size=4, page_order=[3, 0, 7, 5, 11, 1, 8, 2, 10, 6, 4, 9], extra_pages=3)
    return Case(layout, Heads(4, 2, 16, 16), Options(q_dtype="bfloat16", kv_dtype="bfloat16", **options), seed=1)


def make_finding(tmp_path: Path, bug: str, case: Case) -> Path:
    backend = kernel(bug)
    outcome = check_case(backend, case)
    assert outcome.status == "fail", outcome.message
    return save_finding(outcome, backend, tmp_path / "findings", PLANTED.format(bug))


@pytest.fixture
def last_page_finding(tmp_path: Path) -> Path:
    return make_finding(tmp_path, "last_page_off_by_one", mixed_case())


CAP_ALIBI = "tests.triage.cap_alibi_kernels:alibi_then_cap"  # issue 43's user kernel: ALiBi, then the soft cap


def cap_alibi_case(dtype: str, soft_cap: float, seed: int) -> Case:
    """``mixed_case``'s layout and heads with a soft cap and ALiBi on, in ``dtype``."""
    base = mixed_case()
    options = Options(q_dtype=dtype, kv_dtype=dtype, logits_soft_cap=soft_cap, alibi_slopes=(0.5, 0.25, 0.125, 0.0625))
    return base.replace(options=options, seed=seed)
