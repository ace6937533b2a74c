from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from pa_oracle.oracle.case import Case, CaseError, CustomMask, Heads, Layout, Options, Rope, tree_positions
from pa_oracle.oracle.reference import reference
from pa_oracle.oracle.rope import kernel_rotated, key_positions, query_positions, rotated
from pa_oracle.oracle.tensors import load_case, make_tensors, raw_bits, token_addresses

GOLDEN = sorted((Path(__file__).resolve().parents[2] / "golden" / "cases").glob("*.json"))
D_CKV, D_KPE = 8, 4  # MLA_DIMS' small pair (12, 8)


def _mla_case(rope: Rope | None, *, dtype: str = "float32", qo: tuple[int, ...] = (1, 3), kv: tuple[int, ...] = (6, 5),
              causal: bool = True) -> Case:
    layout = Layout.from_lengths(list(qo), list(kv), page_size=4, extra_pages=1)
    opts = Options(causal=causal, q_dtype=dtype, kv_dtype=dtype, rope=rope)
    return Case(layout, Heads(3, 1, D_CKV + D_KPE, D_CKV, mla=True), opts, seed=11)


def _turn(x: list[float], position: int, rope: Rope) -> list[float]:
    """DeepSeek's split by hand: only x[D_CKV:] (q_pe / kpe) rotates, its first ``rotary_dim`` dims, in float64."""
    out = list(x)
    dims = D_KPE if rope.rotary_dim is None else rope.rotary_dim
    for i in range(dims // 2):
        a, b = (i, i + dims // 2) if rope.style == "neox" else (2 * i, 2 * i + 1)
        a, b = D_CKV + a, D_CKV + b
        angle = position / rope.scale * rope.theta ** (-2 * i / dims)
        out[a], out[b] = x[a] * math.cos(angle) - x[b] * math.sin(angle), x[b] * math.cos(angle) + x[a] * math.sin(angle)
    return out


def _by_hand(case: Case, q_pos: list[int], k_pos: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain MQA attention over the hand-rotated rows; V the unrotated first D_CKV dims of each latent row."""
    tensors, rope, lay = make_tensors(case), case.options.rope, case.layout
    assert rope is not None
    pages, slots = token_addresses(case)
    rows = [tensors.k_cache[int(p), int(s), 0].double().tolist() for p, s in zip(pages, slots)]
    keys = [_turn(row, p, rope) for row, p in zip(rows, k_pos)]
    out = torch.zeros(lay.total_q, case.heads.num_qo_heads, D_CKV, dtype=torch.float64)
    lse = torch.full(out.shape[:2], float("-inf"), dtype=torch.float64)
    masks = case.masks()
    row, start = 0, 0
    for b, (qo, kv) in enumerate(zip(lay.qo_lens, lay.kv_lens)):
        for i in range(qo):
            for h in range(case.heads.num_qo_heads):
                q = _turn(tensors.q[row, h].double().tolist(), q_pos[row], rope)
                attended = [j for j in range(kv) if (not case.options.causal or j <= kv - qo + i) and (masks is None or masks[b][i, j])]
                logits = {j: case.sm_scale * sum(a * c for a, c in zip(q, keys[start + j])) for j in attended}
                if logits:
                    top = max(logits.values())
                    weights = {j: math.exp(s - top) for j, s in logits.items()}
                    total = sum(weights.values())
                    out[row, h] = torch.tensor([sum(w * rows[start + j][d] for j, w in weights.items()) / total for d in range(D_CKV)], dtype=torch.float64)
                    lse[row, h] = top + math.log(total)
            row += 1
        start += kv
    return out, lse


@pytest.mark.parametrize("rope", [Rope(theta=100.0), Rope(style="interleaved", theta=10.0, scale=2.0), Rope(theta=100.0, rotary_dim=2)],
                         ids=["neox", "interleaved", "partial"])
def test_the_oracle_rotates_only_q_pe_and_kpe_as_a_hand_computation(rope: Rope) -> None:
    case = _mla_case(rope)
    ref = reference(case, make_tensors(case))
    out, lse = _by_hand(case, [int(p) for p in query_positions(case)], [int(p) for p in key_positions(case)])
    torch.testing.assert_close(ref.out, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(ref.lse, lse, rtol=0, atol=1e-12)


def test_explicit_positions_rotate_the_mla_rope_dims_by_them() -> None:
    parents = (-1, 0, 0)  # depths 0, 1, 1
    layout = Layout.from_lengths([3], [5], page_size=4, extra_pages=1)
    case = Case(layout, Heads(2, 1, D_CKV + D_KPE, D_CKV, mla=True), Options(rope=Rope(theta=100.0)), seed=3,
                custom_mask=CustomMask(tree_parents=(parents,)))
    case = case.replace(positions=tree_positions(layout, (parents,)))
    assert case.positions == ((2, 3, 3),)
    ref = reference(case, make_tensors(case))
    out, lse = _by_hand(case, [2, 3, 3], [0, 1, 2, 3, 3])
    torch.testing.assert_close(ref.out, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(ref.lse, lse, rtol=0, atol=1e-12)


@pytest.mark.parametrize("store", [True, False])
def test_q_nope_and_the_latent_v_are_never_rotated(store: bool) -> None:
    case = _mla_case(Rope(theta=10.0), dtype="bfloat16")
    tensors = make_tensors(case)
    before = tensors.copy()
    pages, slots = token_addresses(case)
    for turned in (rotated(case, tensors), kernel_rotated(case, tensors, store)):
        assert torch.equal(turned.q[..., :D_CKV].double(), tensors.q[..., :D_CKV].double())
        assert not torch.equal(turned.q[..., D_CKV:].double(), tensors.q[..., D_CKV:].double())
        assert torch.equal(turned.k_cache[pages, slots, :, :D_CKV].double(), tensors.k_cache[pages, slots, :, :D_CKV].double())
        assert not torch.equal(turned.k_cache[pages, slots, :, D_CKV:].double(), tensors.k_cache[pages, slots, :, D_CKV:].double())
    assert torch.equal(raw_bits(tensors.k_cache), raw_bits(before.k_cache))  # the inputs stay, poison included
    assert torch.equal(raw_bits(tensors.q), raw_bits(before.q))
    assert tensors.v_is_latent_view()


def test_the_rope_controls_rotate_only_the_rope_dims() -> None:
    case = _mla_case(Rope(theta=1e4), dtype="bfloat16", qo=(2, 4), kv=(40, 30))
    tensors = make_tensors(case)
    ref = reference(case, tensors, logit_noise=True)
    control = ref.rope_control
    assert control is not None
    assert (control.angle_out - ref.out).abs().max() < 1e-5  # float32 angles of the same span: close
    assert (control.out - ref.out).abs().max() < 0.05  # bf16 storage of the rotated q_pe / kpe alone
    whole = case.replace(heads=Heads(3, 1, D_CKV + D_KPE, D_CKV + D_KPE), options=case.options)  # every dim rotated
    whole_row = kernel_rotated(whole, tensors, store=False)
    assert not torch.equal(whole_row.q[..., :D_CKV], kernel_rotated(case, tensors, store=False).q[..., :D_CKV])


def test_rope_on_mla_round_trips_and_names_the_rope_span() -> None:
    case = _mla_case(Rope(style="interleaved", rotary_dim=2))
    assert case.options.rope is not None and case.options.rope.span(case.heads) == (D_CKV, D_CKV + 2)
    assert Rope().span(case.heads) == (D_CKV, D_CKV + D_KPE)
    assert Rope(rotary_dim=4).span(Heads(2, 2, 8, 8)) == (0, 4)
    again = Case.from_json(json.loads(json.dumps(case.to_json())))
    assert again == case and again.case_id == case.case_id
    assert "rope=interleaved" in case.summary() and "mla" in case.summary()


def test_a_rotary_dim_beyond_the_mla_rope_dims_is_refused_by_name() -> None:
    with pytest.raises(CaseError, match=r"options.rope.rotary_dim=6 exceeds the MLA rope dims d_kpe=4"):
        _mla_case(Rope(rotary_dim=6))
    data = _mla_case(Rope()).to_json()
    data.pop("case_id")
    data["options"]["rope"]["rotary_dim"] = 8
    with pytest.raises(CaseError, match="d_kpe=4"):
        Case.from_json(data)


def test_fp8_q_with_rope_on_mla_stays_refused() -> None:
    layout = Layout.from_lengths([1], [3], page_size=2)
    with pytest.raises(CaseError):
        Case(layout, Heads(2, 1, 12, 8, mla=True), Options(q_dtype="float8_e4m3fn", kv_dtype="float8_e4m3fn", o_dtype="bfloat16",
                                                           rope=Rope()))


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_every_golden_case_keeps_its_id(path: Path) -> None:
    assert load_case(path).case_id == json.loads(path.read_text())["case_id"]
