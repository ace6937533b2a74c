from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from pa_oracle.backends.base import Capabilities
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.oracle.case import KV_DTYPES, Case, CaseError, Heads, Layout, Options, Rope
from pa_oracle.oracle.reference import plain_attention, reference
from pa_oracle.oracle.rope import query_positions, rotate, rotated
from pa_oracle.oracle.tensors import Tensors, make_tensors, token_addresses

from tests.oracle.naive import naive_attention

ROPE_CASES = Capabilities(kv_dtypes=KV_DTYPES, rope=(True,))
SMALL = Limits(max_batch=3, max_kv_len=20, max_qo_len=8, max_kv_heads=2, max_qo_heads=8, head_dims=(4, 8))


@settings(max_examples=40)
@given(case=cases(ROPE_CASES, SMALL))
def test_matches_naive_per_token_loop_with_rope(case: Case) -> None:
    assert case.options.rope is not None
    tensors = make_tensors(case)
    ref = reference(case, tensors)
    out, lse = naive_attention(case, tensors)
    torch.testing.assert_close(ref.out, torch.tensor(out, dtype=torch.float64).view_as(ref.out), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ref.lse, torch.tensor(lse, dtype=torch.float64).view_as(ref.lse), rtol=1e-10, atol=1e-12)


@settings(max_examples=25)
@given(case=cases(ROPE_CASES, SMALL))
def test_control_in_float64_matches_the_reference_with_rope(case: Case) -> None:
    tensors = make_tensors(case)
    ref = reference(case, tensors)
    out, lse = plain_attention(case, tensors, torch.float64)
    torch.testing.assert_close(out, ref.out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, ref.lse, rtol=1e-10, atol=1e-12)


def _case(rope: Rope | None, *, causal: bool = True, qo: tuple[int, ...] = (1, 3, 5), kv: tuple[int, ...] = (9, 6, 5)) -> Case:
    layout = Layout.from_lengths(list(qo), list(kv), page_size=4, page_order=None, extra_pages=1)
    return Case(layout, Heads(4, 2, 8, 8), Options(causal=causal, q_dtype="bfloat16", kv_dtype="bfloat16", rope=rope), seed=5)


def test_rope_changes_the_output_and_rotary_dim_zero_is_no_rope() -> None:
    plain, turned, none = _case(None), _case(Rope(theta=100.0)), _case(Rope(rotary_dim=0))
    tensors = make_tensors(plain)  # the tensors do not depend on the options
    base = reference(plain, tensors)
    assert not torch.allclose(reference(turned, tensors).out, base.out, atol=1e-3)
    same = reference(none, tensors)
    assert torch.equal(same.out, base.out) and torch.equal(same.lse, base.lse)


def test_a_huge_scale_freezes_the_angles() -> None:
    plain, frozen = _case(None), _case(Rope(scale=1e6))  # angles <= 9e-6 rad
    tensors = make_tensors(plain)
    torch.testing.assert_close(reference(frozen, tensors).out, reference(plain, tensors).out, rtol=0, atol=1e-4)


@pytest.mark.parametrize("rope", [Rope(), Rope(style="interleaved", theta=500.0, scale=2.0), Rope(rotary_dim=4)])
def test_shifting_every_position_leaves_the_logits_unchanged(rope: Rope) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(6, 2, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    p, j = torch.arange(6, dtype=torch.float64) + 3, torch.arange(6, dtype=torch.float64)
    logits = torch.einsum("nhd,mhd->hnm", rotate(q, p, rope), rotate(k, j, rope))
    for shift in (1.0, 17.0, 1000.0):
        moved = torch.einsum("nhd,mhd->hnm", rotate(q, p + shift, rope), rotate(k, j + shift, rope))
        torch.testing.assert_close(moved, logits, rtol=0, atol=1e-11)
    assert not torch.allclose(torch.einsum("nhd,mhd->hnm", rotate(q, p + 1, rope), rotate(k, j, rope)), logits)


def test_a_window_over_a_longer_request_is_the_same_attention_shifted() -> None:
    """RoPE is relative: a decode query at position 12 whose window sees keys 5..12 attends exactly as
    one at position 7 over keys 0..7 holding the same values (the reference, by absolute position)."""
    rope = Rope(style="interleaved", theta=50.0)
    long = Case(Layout.from_lengths([1], [13], page_size=4), Heads(2, 1, 8, 8), Options(window_left=7, rope=rope), seed=2)
    short = Case(Layout.from_lengths([1], [8], page_size=4), Heads(2, 1, 8, 8), Options(rope=rope), seed=3)
    source = make_tensors(long)
    pages, slots = token_addresses(long)
    target = make_tensors(short)
    short_pages, short_slots = token_addresses(short)
    for cache, long_cache in ((target.k_cache, source.k_cache), (target.v_cache, source.v_cache)):
        cache[short_pages, short_slots] = long_cache[pages[5:], slots[5:]]
    shifted = Tensors(source.q.clone(), target.k_cache, target.v_cache)
    a, b = reference(long, source), reference(short, shifted)
    torch.testing.assert_close(a.out, b.out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a.lse, b.lse, rtol=1e-12, atol=1e-12)


def test_positions_are_bottom_right_aligned_and_poison_stays() -> None:
    case = _case(Rope(), qo=(2, 0, 4), kv=(5, 3, 2))
    assert query_positions(case).tolist() == [3, 4, -2, -1, 0, 1]
    tensors = make_tensors(case)
    turned = rotated(case, tensors)
    assert turned.k_cache.isnan().sum() == tensors.k_cache.isnan().sum() > 0  # the unused page is still poison
    assert turned.v_cache is tensors.v_cache


def test_rope_json_round_trip_and_default_omitted() -> None:
    case = _case(Rope(style="interleaved", theta=5e5, scale=8, rotary_dim=4))
    data = case.to_json()
    assert data["options"]["rope"] == {"style": "interleaved", "theta": 5e5, "scale": 8, "rotary_dim": 4}
    assert Case.from_json(data) == case
    assert "rope" not in _case(None).to_json()["options"]
    assert "rope=interleaved theta=500000 scale=8 rotary_dim=4" in case.summary()


@pytest.mark.parametrize(("rope", "message"), [
    ({"style": "gptj"}, "options.rope.style must be one of"),
    ({"theta": 0.5}, "options.rope.theta must be in"),
    ({"rotary_dim": 3}, "options.rope.rotary_dim must be even"),
    ({"rotary_dim": 10}, "options.rope.rotary_dim=10 exceeds head_dim_qk=8"),
    ({"scale": "2"}, "options.rope.scale: expected number"),
    ({"base": 1e4}, "options.rope.base: unknown field"),
])
def test_bad_rope_is_named(rope: dict, message: str) -> None:
    data = _case(Rope()).to_json()
    data.pop("case_id")
    data["options"]["rope"] = rope
    with pytest.raises(CaseError, match=message.replace("[", r"\[")):
        Case.from_json(data)


def test_rope_on_mla_rotates_its_rope_dims_and_refuses_a_rotary_dim_beyond_them() -> None:  # tests/oracle/test_mla_rope.py
    case = Case(Layout.from_lengths([1], [3], page_size=2), Heads(4, 1, 12, 8, mla=True), Options(rope=Rope()))
    assert case.options.rope is not None and case.options.rope.span(case.heads) == (8, 12)
    with pytest.raises(CaseError, match="MLA rope dims d_kpe=4"):
        case.replace(options=Options(rope=Rope(rotary_dim=6)))


def test_the_first_pair_turns_by_the_position_over_the_scale() -> None:
    x = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]], dtype=torch.float64)
    out = rotate(x, torch.tensor([3.0], dtype=torch.float64), Rope(scale=2.0))
    assert out[0, 0].tolist() == pytest.approx([math.cos(1.5), 0.0, math.sin(1.5), 0.0])
