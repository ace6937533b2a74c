"""Compile keys, variant-aware drawing and the compile budget (``pa_oracle.fuzz.campaign.variants``)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from pa_oracle.backends import get_backend
from pa_oracle.backends.base import Backend
from pa_oracle.backends.flashinfer import module_uri
from pa_oracle.backends.sdpa import SdpaMath
from pa_oracle.fuzz.campaign.engine import CampaignConfig, Shared, fuzz_backend
from pa_oracle.fuzz.campaign.variants import VariantPlan, compile_budget, key_label, plan_variants
from pa_oracle.fuzz.draw.strategies import Limits, cases, variant_keys
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.reference import FUSED_MIN_FLOPS, attended_flops


def _draw(strategy, count: int = 40, at: int = 7) -> list[Case]:  # type: ignore[no-untyped-def]
    drawn: list[Case] = []

    @seed(at)
    @settings(max_examples=count, database=None, deadline=None, phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(case: Case) -> None:
        drawn.append(case)

    collect()
    return drawn


@pytest.mark.parametrize("name", ["flex", "flex-families", "sglang-extend", "sglang-decode-mla", "flashinfer-prefill-fa2", "flashinfer-decode", "vllm-flashinfer"])
def test_restricted_draws_stay_inside_the_keys_and_vary_the_rest(name: str) -> None:
    backend = get_backend(name)
    keys = variant_keys(backend.capabilities, Limits(), backend.compile_fields)[3:5]
    drawn = _draw(cases(backend.capabilities, Limits(), variants=keys))
    assert {backend.compile_key(c) for c in drawn} <= set(keys)
    assert all(backend.capabilities.unsupported_reason(c) is None for c in drawn)
    assert len({c.layout.batch_size for c in drawn}) > 1 and len({c.seed for c in drawn}) > 1
    again = _draw(cases(backend.capabilities, Limits(), variants=keys))
    assert [c.case_id for c in again] == [c.case_id for c in drawn]  # same seed, same keys: same cases


def test_variant_keys_pair_dtypes_as_the_capabilities_do() -> None:
    caps = get_backend("flashinfer-decode").capabilities
    keys = variant_keys(caps, Limits(), ("q_dtype", "kv_dtype", "head_dim_qk"))
    assert all(dict(k)["kv_dtype"] in caps.accepted_kv_dtypes(dict(k)["q_dtype"]) for k in keys)
    assert len(keys) == 2 * 3 * 2  # q f16/bf16, kv q's own or two fp8, dims 64/128 (256 is past the Limits)
    assert variant_keys(caps, Limits(), ()) == [()]
    with pytest.raises(ValueError, match="unknown compile-key field"):
        variant_keys(caps, Limits(), ("tile_size",))


def test_module_uri_names_the_prebuilt_flashinfer_modules() -> None:
    key = (("q_dtype", "bfloat16"), ("kv_dtype", "bfloat16"), ("head_dim_qk", 128), ("alibi", False),
           ("window", True), ("soft_cap", False))
    assert module_uri("decode", key) == (
        "batch_decode_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_128_"
        "head_dim_vo_128_posenc_0_use_swa_True_use_logits_cap_False"
    )
    assert module_uri("prefill", key, "fa3").endswith("use_swa_True_use_logits_cap_False_f16qk_False_sm90")
    tc = get_backend("flashinfer-decode-tc")
    assert tc.modules(key) == [module_uri("prefill", key, "fa2")]


def test_the_plan_rotates_with_the_seed_and_keeps_free_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = get_backend("flashinfer-prefill-fa2")
    free_dim = 64
    monkeypatch.setattr(type(backend), "built_reason", lambda self, key: "prebuilt" if dict(key)["head_dim_qk"] == free_dim else None)
    first = plan_variants(backend, Limits(), budget=120, seed=0)
    second = plan_variants(backend, Limits(), budget=120, seed=1)
    assert first is not None and second is not None
    assert len(first.chosen) == 2 and not set(first.chosen) & set(second.chosen)  # 120 s / 60 s a module
    assert all(dict(k)["head_dim_qk"] != free_dim for k in first.chosen)
    assert set(first.free) <= set(first.usable()) and set(first.chosen) <= set(first.usable())
    first.spent = first.budget  # spent before any chosen key was built: only the free ones stay
    assert set(first.usable()) == set(first.free)
    assert first.redirect(first.chosen[0]) in first.free  # a draw of an unbuilt key is steered to a built one
    first.compiled[first.chosen[1]] = 60.0
    assert first.redirect(first.chosen[1]) == first.chosen[1]  # built this run: stays (a replay draws the same)
    assert "never built" in first.lines()[0]


def test_a_backend_with_nothing_to_compile_draws_as_before() -> None:
    assert plan_variants(get_backend("sdpa-math"), Limits(), budget=10, seed=0) is None
    assert compile_budget(None, None) is None and compile_budget(100, None) == pytest.approx(30)
    assert compile_budget(100, 5) == 5


class _DtypeKeyed(SdpaMath):
    """sdpa-math that pretends to compile one variant per q dtype (a CPU stand-in for a JIT kernel);
    not registered: the registry is every other test's list of adapters."""

    name = "test-dtype-keyed"
    compile_fields = ("q_dtype",)
    compile_seconds = 1.0


def test_a_campaign_draws_inside_the_planned_variants() -> None:
    backend: Backend = _DtypeKeyed()
    plan = plan_variants(backend, Limits(max_batch=2, max_kv_len=20), budget=1.0, seed=3)
    assert plan is not None and len(plan.chosen) == 1
    result = fuzz_backend(backend, CampaignConfig(examples=12, limits=Limits(max_batch=2, max_kv_len=20), isolate=False), shared=Shared(variants=plan))
    assert result.examples == 12
    assert set(plan.ran) == set(plan.chosen) and sum(plan.ran.values()) == 12
    assert key_label(plan.chosen[0]) in plan.lines()[0]


def test_fuzz_sized_cases_stay_below_the_fused_threshold() -> None:
    limits = Limits()
    largest = Case(
        Layout.from_lengths([limits.max_qo_len] * limits.max_batch, [limits.max_kv_len] * limits.max_batch, 16),
        Heads(limits.max_qo_heads, 1, 256, 256), Options(),
    )
    assert attended_flops(largest) < FUSED_MIN_FLOPS


@pytest.mark.parametrize(("lq", "lk", "used"), [(512, 2048, (100, 450)), (512, 2048, (384, 1800)), (512, 512, None)])
def test_flex_block_mask_is_torchs(lq: int, lk: int, used: tuple[int, int] | None) -> None:
    import torch
    from pa_oracle.backends.flex import block_mask_of
    from torch.nn.attention.flex_attention import create_block_mask

    gen = torch.Generator().manual_seed(lq + lk)
    nq, nk = used or (lq, lk)
    doc_q = torch.cat([torch.randint(0, 3, (nq,), generator=gen), torch.full((lq - nq,), -1)])
    doc_k = torch.cat([torch.randint(0, 3, (nk,), generator=gen), torch.full((lk - nk,), -2)])
    q_pos, k_pos = torch.randint(0, 300, (lq,), generator=gen), torch.randint(0, 300, (lk,), generator=gen)
    causal, window = torch.tensor(True), torch.tensor(7)

    def mask_mod(b, h, qi, kv):  # type: ignore[no-untyped-def]
        keep = (doc_q[qi] == doc_k[kv]) & (~causal | (k_pos[kv] <= q_pos[qi]))
        return keep & ((window < 0) | (k_pos[kv] >= q_pos[qi] - window))

    theirs = create_block_mask(mask_mod, 1, 1, lq, lk, device="cpu")
    ours = block_mask_of(mask_mod, lq, lk, torch.device("cpu"), used=used)
    assert torch.equal(ours.to_dense(), theirs.to_dense())
    assert all(torch.equal(a, b) for a, b in zip(ours.as_tuple(), theirs.as_tuple()) if isinstance(a, torch.Tensor))


def test_keys_naming_option_values_pin_them_and_keep_them_off_half_the_time() -> None:
    """SGLang's Triton kernels compile per window and soft-cap value: its keys name the values, a case
    drawn inside one has exactly them, and the plans' keys have each option off about half the time
    (as an unrestricted draw has it), not in one key of 1 + the number of values."""
    backend = get_backend("sglang-extend")
    keys = [k for k in variant_keys(backend.capabilities, Limits(), backend.compile_fields)
            if dict(k)["window_left"] > 0 and dict(k)["logits_soft_cap"] > 0][:2]
    for case in _draw(cases(backend.capabilities, Limits(), variants=keys)):
        assert backend.compile_key(case) in keys
        assert (case.options.window_left, case.options.logits_soft_cap) in {
            (dict(k)["window_left"], dict(k)["logits_soft_cap"]) for k in keys}
    chosen = [dict(k) for s in range(30) for k in plan_variants(backend, Limits(), budget=40, seed=s).chosen]
    assert 0.35 < sum(k["window_left"] < 0 for k in chosen) / len(chosen) < 0.65
    assert 0.35 < sum(k["logits_soft_cap"] == 0 for k in chosen) / len(chosen) < 0.65
    assert not any(k["window_left"] == 0 for k in chosen)  # refused: SGLang cannot express window_left 0
    assert key_label((("head_dim_qk", 64), ("window_left", 17), ("logits_soft_cap", 30.0))) == "hd64 window17 cap30"
    assert key_label((("window_left", -1), ("logits_soft_cap", 0.0))) == "(one variant)"


def test_the_sink_wrapper_draws_sink_keys_only_and_names_its_module() -> None:
    backend = get_backend("flashinfer-sinks")
    plan = plan_variants(backend, Limits(), budget=1000, seed=0)
    assert plan.space > 0 and all(dict(k)["sinks"] for k in plan.keys)
    assert all(c.options.sinks is not None for c in _draw(plan.strategy(Limits()), count=20))
    key = (("q_dtype", "bfloat16"), ("head_dim_qk", 64), ("window", True), ("sinks", True))
    assert backend.sink_uri(key) == "batch_prefill_attention_sink_bf16_swa_True_fa2"  # 0.6.18: no head dim in it


def test_a_key_compiling_is_announced_once_however_many_of_its_cases_are_queued() -> None:
    backend = get_backend("flex")
    said: list[str] = []
    plan = plan_variants(backend, Limits(), budget=30, seed=0)
    plan.announce = said.append
    key = plan.chosen[0]
    drawn = _draw(cases(backend.capabilities, Limits(), variants=[key]), count=3)
    assert len(drawn) == 3 and {backend.compile_key(c) for c in drawn} == {key} and key not in plan.free
    for case in drawn:  # queued: none observed yet
        plan.before(case)
    assert len(said) == 1 and "compiling flex" in said[0]


def test_the_sink_wrapper_builds_by_judging_not_with_the_plain_prefills_spec() -> None:
    """Its keys name no KV dtype: the plain prefill's ``module_spec`` would raise KeyError (the H200 warm-up did)."""
    key = (("q_dtype", "bfloat16"), ("head_dim_qk", 128), ("window", False), ("sinks", True))
    assert get_backend("flashinfer-sinks").build_variants([key]) is None


def test_a_module_every_key_shares_is_built_before_the_keys_of_its_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlashInfer's cascade loads merge_state's module, which no key names: the run's builds build it first, as a task
    of its own, even when the budget plans no key of it."""
    from pa_oracle.fuzz.campaign.builds import SHARED
    from pa_oracle.fuzz.campaign.compile_plan import CompilePlan

    cascade, decode = get_backend("flashinfer-cascade"), get_backend("flashinfer-decode")
    monkeypatch.setattr("pa_oracle.backends.flashinfer.built_module", lambda uri: None)  # nothing built here
    plan = CompilePlan.make([cascade, decode], Limits(), budget=1000, seed=0)
    tasks = plan.tasks(Limits(), 0, lambda backend: backend.name)
    mine = [t.key for t in tasks if t.backend == cascade.name]
    assert mine[0] == SHARED and len(mine) == 1 + len(plan.plans[cascade.name].chosen)
    assert SHARED not in [t.key for t in tasks if t.backend == decode.name], "decode loads no shared module"
    assert all(t.ahead for t in tasks), "FlashInfer builds its modules ahead (build_variants), not by judging a case"


def test_cascade_builds_merge_states_module_when_it_is_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = get_backend("flashinfer-cascade")
    monkeypatch.setattr("pa_oracle.backends.flashinfer_cascade.built_module", lambda uri: "cached" if uri == "cascade" else None)
    assert backend.build_shared() is False
    assert get_backend("flashinfer-decode").build_shared() is False


def test_a_key_whose_cases_are_all_known_is_passed_over_for_the_next() -> None:
    """The H200's sglang-extend-mask campaign drew 459 cases, every one skipped as known: its keys all fell in
    a ledger class. With ``known``, such keys give way to the next keys of the order; without, nothing changes."""
    backend = get_backend("flex")
    before = plan_variants(backend, Limits(), budget=30, seed=0)
    dim = dict(before.chosen[0])["head_dim_qk"]
    again = plan_variants(backend, Limits(), budget=30, seed=0, known=lambda case: False)
    assert again.chosen == before.chosen  # nothing known: the same keys, so the same cases
    after = plan_variants(backend, Limits(), budget=30, seed=0, known=lambda case: case.heads.head_dim_qk == dim)
    assert len(after.chosen) == len(before.chosen)
    assert all(dict(k)["head_dim_qk"] != dim for k in after.chosen)
    assert set(k for k in before.chosen if dict(k)["head_dim_qk"] != dim) <= set(after.chosen)


def test_a_free_keys_first_case_that_compiled_what_no_key_names_counts_as_compiling_once_the_pace_is_known() -> None:
    """FlashInfer's cascade loads its merge module on its first case (8.8 s on the H200) though its prefill key is
    prebuilt: that case is compiling, which shows only once warm cases set the pace. The case judged beside it
    waited for the same compile: only what it took past it counts."""
    backend = get_backend("flex")
    key = variant_keys(backend.capabilities, Limits(), backend.compile_fields)[0]
    case = _draw(cases(backend.capabilities, Limits(), variants=[key]), count=1)[0]

    def counted(*seconds: float) -> tuple[list[float], float]:
        plan = VariantPlan(backend, 1, {key: "cached"}, [], budget=100.0)
        return [plan.observe(case, s) for s in seconds], plan.spent

    assert counted(9.0, 8.9, 0.05, 0.04, 0.06, 0.05, 0.05) == ([0.0] * 4 + [9.0, 0.0, 0.0], 9.0)
    assert counted(0.05, 10.0, 9.9, 0.05, 16.0, 0.05) == ([0.0, 10.0, 0.0, 0.0, 16.0, 0.0], 26.0)  # beside, then alone
    assert counted(0.02, 6.0, 0.02, 0.02) == ([0.0, 6.0, 0.0, 0.0], 6.0)  # slow after a warm case: at once
    assert counted(1.2, 0.01, 0.01, 0.01, 0.01, 0.01) == ([0.0] * 6, 0.0)  # a process's warm-up is no compile
    assert counted(0.3, 0.05, 0.04, 0.06, 0.05, 0.07) == ([0.0] * 6, 0.0)
