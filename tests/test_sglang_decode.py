"""The SGLang Triton decode adapters' declared conventions (no GPU needed: the checks run before any launch)."""

from __future__ import annotations

from pa_oracle.backends import get_backend
from pa_oracle.oracle.case import Case, Heads, Layout, Options


F16 = Options(q_dtype="float16", kv_dtype="float16")


def test_gqa_with_a_head_dim_below_16_is_unsupported_not_a_crash() -> None:
    """The grouped stage-1 kernel's tl.dot cannot compile below 16 (the H200 campaign's CompilationError on 6/1
    heads, dims 8/80); the group-1 kernel sums in float32 and takes any dim."""
    backend = get_backend("sglang-decode")
    layout = Layout.from_lengths([1], [1], 16)
    grouped = backend.unsupported_reason(Case(layout, Heads(6, 1, 8, 80), F16))
    assert grouped is not None and "dims >= 16" in grouped
    assert backend.unsupported_reason(Case(layout, Heads(2, 2, 8, 80), F16)) is None
    assert backend.unsupported_reason(Case(layout, Heads(6, 1, 16, 80), F16)) is None


def test_the_plan_never_chooses_a_key_whose_every_case_is_unsupported() -> None:
    from pa_oracle.fuzz.campaign.variants import plan_variants
    from pa_oracle.fuzz.draw.strategies import Limits

    backend = get_backend("sglang-decode")
    chosen = [dict(k) for s in range(10) for k in plan_variants(backend, Limits(), budget=120, seed=s).chosen]
    assert chosen and not any(k["group_size"] > 1 and min(k["head_dim_qk"], k["head_dim_vo"]) < 16 for k in chosen)
