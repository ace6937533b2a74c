from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, seed, settings
from pa_oracle.backends import get_backend
from pa_oracle.backends.base import Capabilities
from pa_oracle.backends.user import UserKernel, declare
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
from pa_oracle.fuzz.draw.determinism import seed_only_draws
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.quality import planted_positions
from pa_oracle.oracle.case import Case, CustomMask, Heads, Layout, Options, Rope, index_positions, tree_positions
from pa_oracle.oracle.tensors import make_tensors

TREES = Capabilities(custom_mask=(True,), rope=(True,), rope_positions=True)
SMALL = Limits(max_batch=3, max_kv_len=20, max_qo_len=8, max_kv_heads=2, max_qo_heads=4, head_dims=(4, 8))


def _drawn(caps: Capabilities, count: int = 40) -> list[Case]:
    drawn: list[Case] = []

    @seed(34)
    @settings(max_examples=count, database=None, deadline=None, phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(cases(caps, SMALL))
    def take(case: Case) -> None:
        drawn.append(case)

    with seed_only_draws():
        take()
    return drawn


def test_rope_trees_draw_depth_positions_only_for_a_kernel_that_takes_them_and_nothing_else_moves() -> None:
    with_positions, without = _drawn(TREES), _drawn(TREES.replace(rope_positions=False))
    assert [c.replace(positions=None).case_id for c in with_positions] == [c.case_id for c in without]
    assert all(c.positions is None for c in without)
    trees = [c for c in with_positions if c.custom_mask.tree_parents is not None]
    assert trees and all((c.positions or index_positions(c.layout)) == tree_positions(c.layout, c.custom_mask.tree_parents) for c in trees)
    assert any(c.positions is not None for c in trees)  # a tree with a branch somewhere
    assert all(c.positions is None for c in with_positions if c.custom_mask.tree_parents is None)


def test_a_user_kernel_naming_positions_or_tree_parents_gets_them() -> None:
    seen: dict[str, list[int] | None] = {}

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, custom_mask, mask_indptr,  # noqa: ANN001
               rope, positions, key_positions, tree_parents):
        seen.update(positions=positions.tolist(), key_positions=key_positions.tolist(),
                    tree_parents=None if tree_parents is None else tree_parents.tolist())
        return q.new_zeros(q.shape)

    backend = UserKernel(kernel)
    assert backend.capabilities.rope_positions and not UserKernel(_rope_only).capabilities.rope_positions
    parents = ((-1, -1, 0), (-1,))
    layout = Layout.from_lengths([3, 1], [5, 2], page_size=2)
    case = Case(layout, Heads(1, 1, 4, 4), Options(rope=Rope()), custom_mask=CustomMask(tree_parents=parents),
                positions=tree_positions(layout, parents))
    assert backend.unsupported_reason(case) is None
    backend.run(backend.plan(case), make_tensors(case))
    assert seen == {"positions": [2, 2, 3, 1], "key_positions": [0, 1, 2, 2, 3, 0, 1], "tree_parents": [-1, -1, 0, -1]}
    plain = Case(layout, Heads(1, 1, 4, 4), Options(rope=Rope()))
    backend.run(backend.plan(plain), make_tensors(plain))
    assert seen == {"positions": [2, 3, 4, 1], "key_positions": [0, 1, 2, 3, 4, 0, 1], "tree_parents": None}


def _rope_only(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, custom_mask, mask_indptr, rope):  # noqa: ANN001
    return q


def test_kernels_without_positions_decline_such_a_case_by_name() -> None:
    layout = Layout.from_lengths([2], [4], page_size=16)
    case = Case(layout, Heads(4, 4, 64, 64), Options(q_dtype="bfloat16", kv_dtype="bfloat16", rope=Rope()),
                custom_mask=CustomMask(tree_parents=((-1, -1),)), positions=((2, 2),))
    for backend in (get_backend("flashinfer-prefill-fa2-rope"), UserKernel(_rope_only)):
        reason = backend.unsupported_reason(case)
        assert reason is not None and "RoPE positions other than the index ones" in reason, (backend.name, reason)


def test_eagle_verify_rotating_by_index_is_caught_by_the_depth_draw_alone() -> None:
    found = fuzz_backend(UserKernel(planted_positions.eagle_rope_by_index), CampaignConfig(examples=50, seed=0, isolate=False))
    assert found.finding is not None and found.finding.case.positions is not None, found.examples
    blind = declare(**planted_positions._CAPABILITIES, rope_positions=False)(_by_index_copy())
    missed = fuzz_backend(UserKernel(blind), CampaignConfig(examples=40, seed=0, isolate=False))
    assert missed.finding is None and missed.examples == 40  # index positions only: the bug cannot show


def _by_index_copy():  # type: ignore[no-untyped-def]
    """The planted bug as its own function object (``declare`` marks the function it is given)."""
    return planted_positions._eagle_verify(by_index=True)


def test_the_correct_depth_rotating_kernel_stays_clean() -> None:
    result = fuzz_backend(UserKernel(planted_positions.correct_eagle_rope), CampaignConfig(examples=40, seed=1, isolate=False))
    assert result.finding is None and result.examples == 40
