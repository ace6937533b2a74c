from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from pa_oracle.oracle.case import Case, CaseError, CustomMask, Heads, Layout, Options, Rope, index_positions, tree_positions
from pa_oracle.oracle.fused import unsupported_reason
from pa_oracle.oracle.reference import reference
from pa_oracle.oracle.rope import key_positions, query_positions, rotated
from pa_oracle.oracle.tensors import load_case, make_tensors, token_addresses

GOLDEN = sorted((Path(__file__).resolve().parents[2] / "golden" / "cases").glob("*.json"))
PARENTS = (-1, -1, 0, 2)  # two roots; node 2 under root 0, node 3 under node 2: depths 0, 0, 1, 2


def _tree_case(rope: Rope | None = Rope(theta=100.0), *, depth: bool = True, prefix: int = 3, seed: int = 7) -> Case:
    layout = Layout.from_lengths([len(PARENTS)], [prefix + len(PARENTS)], page_size=4, extra_pages=1)
    case = Case(layout, Heads(1, 1, 4, 4), Options(rope=rope), seed=seed, custom_mask=CustomMask(tree_parents=(PARENTS,)))
    return case.replace(positions=tree_positions(layout, (PARENTS,))) if depth else case


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_the_index_positions_are_no_positions_and_keep_every_golden_id(path: Path) -> None:
    case = load_case(path)
    assert case.case_id == json.loads(path.read_text())["case_id"]
    same = case.replace(positions=index_positions(case.layout))
    assert same.positions is None and same.case_id == case.case_id and "positions" not in same.to_json()


def test_depth_positions_are_prefix_plus_depth_and_keys_follow_their_nodes() -> None:
    case = _tree_case()
    assert case.positions == ((3, 3, 4, 5),)
    assert query_positions(case).tolist() == [3, 3, 4, 5]
    assert key_positions(case).tolist() == [0, 1, 2, 3, 3, 4, 5]  # prefix at its index, each node's key at its node's
    chain = Case(Layout.from_lengths([3], [5], 4), Heads(1, 1, 4, 4), Options(rope=Rope()), custom_mask=CustomMask(tree_parents=((-1, 0, 1),)))
    assert tree_positions(chain.layout, ((-1, 0, 1),)) == index_positions(chain.layout)  # a chain: depth = index


def _turn(x: list[float], position: int, rope: Rope) -> list[float]:
    """neox rotation of a whole head, written out with math."""
    half, out = len(x) // 2, list(x)
    for i in range(half):
        angle = position / rope.scale * rope.theta ** (-2 * i / len(x))
        a, b = x[i], x[i + half]
        out[i], out[i + half] = a * math.cos(angle) - b * math.sin(angle), b * math.cos(angle) + a * math.sin(angle)
    return out


def test_the_oracle_rotates_by_the_explicit_positions_as_a_hand_computation() -> None:
    case = _tree_case()
    rope = case.options.rope
    tensors = make_tensors(case)
    turned = rotated(case, tensors)
    q_pos, k_pos = [3, 3, 4, 5], [0, 1, 2, 3, 3, 4, 5]
    for row, p in enumerate(q_pos):
        assert turned.q[row, 0].tolist() == pytest.approx(_turn(tensors.q[row, 0].double().tolist(), p, rope), abs=1e-12)
    pages, slots = token_addresses(case)
    keys = []
    for j, p in enumerate(k_pos):
        page, slot = int(pages[j]), int(slots[j])
        keys.append(_turn(tensors.k_cache[page, slot, 0].double().tolist(), p, rope))
        assert turned.k_cache[page, slot, 0].tolist() == pytest.approx(keys[-1], abs=1e-12)
    ref = reference(case, tensors)
    masks = case.masks()[0]
    for row, p in enumerate(q_pos):  # attention under the tree mask, by hand
        q = _turn(tensors.q[row, 0].double().tolist(), p, rope)
        logits = {j: case.sm_scale * sum(a * b for a, b in zip(q, keys[j])) for j in range(len(k_pos)) if masks[row, j]}
        top = max(logits.values())
        weights = {j: math.exp(s - top) for j, s in logits.items()}
        total = sum(weights.values())
        out = [sum(w * float(tensors.v_cache[int(pages[j]), int(slots[j]), 0, d]) for j, w in weights.items()) / total for d in range(4)]
        assert ref.out[row, 0].tolist() == pytest.approx(out, abs=1e-12)
        assert float(ref.lse[row, 0]) == pytest.approx(top + math.log(total), abs=1e-12)


def test_depth_positions_change_the_output_only_where_a_node_sits_off_its_index() -> None:
    by_depth, by_index = _tree_case(), _tree_case(depth=False)
    tensors = make_tensors(by_index)
    a, b = reference(by_depth, tensors), reference(by_index, tensors)
    assert torch.equal(a.out[0], b.out[0])  # root 0: depth 0 = index 0, its keys are the prefix and itself
    assert not torch.allclose(a.out[1:], b.out[1:], atol=1e-6)


def test_the_rope_controls_rotate_by_the_same_positions() -> None:
    case = _tree_case(Rope(theta=1e4))
    case = case.replace(options=Options(q_dtype="bfloat16", kv_dtype="bfloat16", rope=case.options.rope))
    tensors = make_tensors(case)
    ref = reference(case, tensors, logit_noise=True)
    control = ref.rope_control
    assert control is not None
    assert (control.angle_out - ref.out).abs().max() < 1e-5  # float32 angles at the same positions: close
    wrong = reference(case.replace(positions=None), tensors, logit_noise=True).rope_control
    assert (wrong.angle_out - ref.out).abs().max() > 1e-3  # the index positions' control is another attention


def test_the_fused_engine_declines_explicit_positions() -> None:
    assert "positions" in unsupported_reason(_tree_case())


def test_positions_round_trip_through_json_and_name_the_field_when_wrong(tmp_path: Path) -> None:
    case = _tree_case()
    again = Case.from_json(json.loads(json.dumps(case.to_json())))
    assert again.positions == case.positions and again.case_id == case.case_id != _tree_case(depth=False).case_id
    data = case.to_json()
    bad = {
        "positions[0][1]": [[3, 3.5, 4, 5]],
        "positions has 2 requests, the layout 1": [[3, 3, 4, 5], []],
        "positions[0] has 3 entries, request 0 has qo_len 4": [[3, 3, 4]],
        "expected list": 5,
    }
    for message, value in bad.items():
        with pytest.raises(CaseError, match=r"case JSON: .*" + message.replace("[", r"\[").replace("]", r"\]")):
            Case.from_json({**data, "positions": value})
    with pytest.raises(CaseError, match=r"positions: explicit positions are RoPE positions .* no options.rope"):
        _tree_case(None)
    with pytest.raises(CaseError, match=r"positions\[0\]\[0\] must be <= 2147483647"):
        case.replace(positions=((2**31, 3, 4, 5),))
