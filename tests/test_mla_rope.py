from __future__ import annotations

from typing import Any

import torch
from hypothesis import HealthCheck, Phase, find, given, seed, settings
from pa_oracle.backends import discover, get_backend
from pa_oracle.backends.base import Capabilities
from pa_oracle.backends.user import UserKernel, capabilities_of, declare
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
from pa_oracle.fuzz.draw.determinism import seed_only_draws
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.quality import planted_mla_rope, selftest
from pa_oracle.oracle.case import Case, Heads, Layout, Options, Rope
from pa_oracle.oracle.rope import key_positions, query_positions
from pa_oracle.oracle.tensors import make_tensors

MLA_ROPE = Capabilities(mla=(True,), mla_dims=((12, 8), (24, 16), (576, 512)), rope=(False, True))
SMALL = Limits(max_batch=3, max_kv_len=16, max_qo_len=4, max_qo_heads=4)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cases(MLA_ROPE, SMALL))
def test_an_mla_kernel_declaring_rope_draws_rope_within_the_rope_dims(case: Case) -> None:
    assert case.heads.mla
    rope = case.options.rope
    if rope is not None:
        start, stop = rope.span(case.heads)
        assert start == case.heads.d_ckv and start < stop <= case.heads.head_dim_qk
        assert MLA_ROPE.unsupported_reason(case) is None


def test_the_mla_rope_draw_reaches_whole_and_partial_rope_dims() -> None:
    whole = find(cases(MLA_ROPE, SMALL), lambda c: c.options.rope is not None and c.options.rope.rotary_dim is None)
    assert whole.options.rope is not None and whole.options.rope.span(whole.heads)[1] == whole.heads.head_dim_qk
    partial = find(cases(MLA_ROPE, SMALL), lambda c: c.options.rope is not None and c.options.rope.rotary_dim is not None)
    assert partial.options.rope is not None and partial.options.rope.rotary_dim < partial.heads.d_kpe  # type: ignore[operator]
    no_partial = MLA_ROPE.replace(rope_partial=False)
    drawn = find(cases(no_partial, SMALL), lambda c: c.options.rope is not None)
    assert drawn.options.rope is not None and drawn.options.rope.rotary_dim is None and no_partial.unsupported_reason(drawn) is None


def _library_mla() -> list[str]:
    return sorted(name for name, cls in discover().items() if True in cls.capabilities.mla)


def test_library_mla_adapters_declare_no_rope_and_never_draw_it() -> None:
    names = _library_mla()
    assert {"flashinfer-mla", "flashinfer-mla-fa3", "sglang-decode-mla"} <= set(names), names
    for name in names:
        caps = get_backend(name).capabilities
        assert caps.rope == (False,), name  # they take q_pe / k_pe rotated already: no fused RoPE
        drawn: list[Case] = []

        @seed(1234)
        @settings(max_examples=15, database=None, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=cases(caps))
        def draw(case: Case) -> None:
            drawn.append(case)

        with seed_only_draws():
            draw()
        assert drawn and all(c.options.rope is None for c in drawn) and any(c.heads.mla for c in drawn), name


def test_an_mla_user_kernel_naming_rope_gets_the_unrotated_rows_and_the_rope() -> None:
    seen: dict[str, Any] = {}

    @declare(mla=(True,), mla_dims=((12, 8),))
    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,  # type: ignore[no-untyped-def]
               window_left, logits_soft_cap, rope=None, positions=None, key_positions=None):
        seen.update(q=q.clone(), k_cache=k_cache.clone(), v_is_view=v_cache.data_ptr() == k_cache.data_ptr(), rope=rope,
                    positions=positions, key_positions=key_positions)
        return torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype)

    caps = capabilities_of(kernel)
    assert caps.mla == (True,) and caps.rope == (False, True)
    layout = Layout.from_lengths([2, 1], [5, 3], page_size=4)
    case = Case(layout, Heads(2, 1, 12, 8, mla=True), Options(causal=True, rope=Rope(style="interleaved")), seed=4)
    tensors = make_tensors(case)
    UserKernel(kernel).run(case, tensors)
    assert seen["rope"] == case.options.rope and seen["v_is_view"]
    assert torch.equal(seen["q"], tensors.q)  # unrotated: the kernel rotates q_pe itself
    assert seen["positions"].tolist() == query_positions(case).tolist()
    assert seen["key_positions"].tolist() == key_positions(case).tolist()


def test_rotating_the_whole_latent_row_is_caught_by_the_mla_rope_draw_alone() -> None:
    for bug in planted_mla_rope.PLANTED:
        found = fuzz_backend(UserKernel(getattr(planted_mla_rope, bug)), CampaignConfig(examples=50, seed=0, isolate=False,
                                                                                        shrink_seconds=5.0))
        assert found.finding is not None, (bug, found.examples)
        assert found.finding.case.heads.mla and found.finding.case.options.rope is not None, bug
        assert found.examples <= 50, (bug, found.examples)
    blind = declare(rope=(False,))(planted_mla_rope._mla_rope_kernel("mla_rope_whole_row"))
    missed = fuzz_backend(UserKernel(blind), CampaignConfig(examples=40, seed=0, isolate=False))
    assert missed.finding is None and missed.examples == 40  # MLA without RoPE: the bug cannot show


def test_the_correct_mla_rope_kernel_stays_clean_over_100_cases() -> None:
    result = fuzz_backend(UserKernel(planted_mla_rope.correct_mla_rope), CampaignConfig(examples=100, seed=3, isolate=False))
    assert result.finding is None and result.examples == 100


def test_the_selftest_runs_the_mla_rope_kernels() -> None:
    names = {name for module, name in selftest.selftest_kernels() if module is planted_mla_rope}
    assert names == {"mla_rope_whole_row", "mla_rope_span_from_zero", "correct_mla_rope"}
