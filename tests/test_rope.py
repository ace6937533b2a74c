from __future__ import annotations


import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from pa_oracle.backends import get_backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.engine import fuzz_backend
from pa_oracle.fuzz.checks.metamorphic import RELATIONS, windowed
from pa_oracle.fuzz.draw.strategies import Limits, cases, variant_keys
from pa_oracle.fuzz.quality import planted
from pa_oracle.oracle.case import Case, Heads, Layout, Options, Rope
from pa_oracle.oracle.tensors import make_tensors

ROPE_BACKENDS = ("flashinfer-decode-rope", "flashinfer-decode-tc-rope", "flashinfer-prefill-fa2-rope")
RELATION = {r.name: r for r in RELATIONS}

# seed 1234, the first 10 of 40 draws with Limits() (Hypothesis 6.170): the ids main drew before RoPE existed
def _draw(caps, count: int, at: int = 1234) -> list[Case]:  # noqa: ANN001
    found: list[Case] = []

    @seed(at)
    @settings(max_examples=count, database=None, deadline=None, derandomize=False, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(cases(caps, Limits()))
    def take(case: Case) -> None:
        found.append(case)

    take()
    return found


# (that kernels without RoPE draw exactly the cases they drew before it existed: tests/test_same_draws.py)


def test_rope_is_drawn_only_where_declared_and_within_the_declaration() -> None:
    for name in ("sdpa-math", "flashinfer-decode", "flashinfer-prefill-fa2"):
        assert all(c.options.rope is None for c in _draw(get_backend(name).capabilities, 30)), name
    for name in ROPE_BACKENDS:
        backend = get_backend(name)
        drawn = _draw(backend.capabilities, 30)
        assert all(c.options.rope is not None and backend.unsupported_reason(c) is None for c in drawn), name
        assert all(c.options.rope.style == "neox" and c.options.rope.rotary_dim is None for c in drawn), name
        assert all(c.options.alibi_slopes is None for c in drawn), name
    optional = UserKernel(lambda q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, rope=None: q)
    drawn = _draw(optional.capabilities, 60)
    styles = {c.options.rope.style for c in drawn if c.options.rope is not None}
    assert styles == {"neox", "interleaved"} and any(c.options.rope is None for c in drawn)
    assert any(c.options.rope is not None and c.options.rope.rotary_dim is not None for c in drawn)


def test_prefill_rope_excludes_queries_before_the_first_key() -> None:
    backend = get_backend("flashinfer-prefill-fa2-rope")
    assert all(q <= k for c in _draw(backend.capabilities, 40) for q, k in zip(c.layout.qo_lens, c.layout.kv_lens))
    case = Case(Layout.from_lengths([3], [1], 16), Heads(4, 2, 64, 64), Options(q_dtype="bfloat16", kv_dtype="bfloat16", rope=Rope()))
    assert "outside the kernel's contract" in backend.unsupported_reason(case)


def test_rope_selects_its_own_flashinfer_module() -> None:
    backend = get_backend("flashinfer-decode-rope")
    keys = variant_keys(backend.capabilities, Limits(), backend.compile_fields)
    assert keys and all(dict(k)["rope"] is True for k in keys)
    assert all("_posenc_1_" in uri for k in keys for uri in backend.modules(k))
    plain = get_backend("flashinfer-decode")
    assert all("_posenc_0_" in uri or "_posenc_2_" in uri for k in variant_keys(plain.capabilities, Limits(), plain.compile_fields)
               for uri in plain.modules(k))
    case = Case(Layout.from_lengths([1], [5], 16), Heads(4, 2, 64, 64),
                Options(q_dtype="bfloat16", kv_dtype="bfloat16", rope=Rope(theta=5e5, scale=8.0)))
    kwargs = backend._common_plan_kwargs(case)
    assert (kwargs["pos_encoding_mode"], kwargs["rope_theta"], kwargs["rope_scale"]) == ("ROPE_LLAMA", 5e5, 8.0)
    assert backend.call_source(case) is None  # the standalone repro's reference has no RoPE


def test_user_kernel_gets_the_rope_and_rope_cases_skip_kernels_without_it() -> None:
    seen = []

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, rope=None):  # noqa: ANN001
        seen.append(rope)
        return q

    case = Case(Layout.from_lengths([1], [3], 2), Heads(2, 1, 8, 8), Options(rope=Rope(style="interleaved")))
    UserKernel(kernel).run(case, make_tensors(case))
    assert seen == [Rope(style="interleaved")]
    assert "rope=True" in get_backend("sdpa-math").unsupported_reason(case)


def test_campaign_catches_swapped_rope_pairing_and_passes_a_correct_rope_kernel() -> None:
    swapped = fuzz_backend(UserKernel(planted.rope_pairing_swapped), examples=60, base_seed=0, isolate=False)
    assert swapped.finding is not None and swapped.finding.case.options.rope is not None
    correct = fuzz_backend(UserKernel(planted.correct_rope), examples=25, base_seed=0, isolate=False)
    assert correct.finding is None, correct.finding and correct.finding.message


def test_merge_declines_rope_and_a_non_causal_window_drops_it() -> None:
    layout = Layout.from_lengths([1, 3], [9, 6], 4)
    case = Case(layout, Heads(4, 2, 8, 8), Options(causal=True, rope=Rope()), seed=1)
    backend = UserKernel(planted.correct_rope)
    assert isinstance(RELATION["merge"].capabilities(backend), str)
    assert RELATION["merge"](backend, case).status == "unsupported"
    assert windowed(case).options.rope == Rope()
    assert windowed(case.replace(options=Options(rope=Rope()))).options.rope is None
    outcome = RELATION["window"](backend, case)
    assert outcome.status == "pass", outcome.message


def test_planted_rope_kernels_are_in_the_selftest() -> None:
    assert "rope_pairing_swapped" in planted.PLANTED and "correct_rope" in planted.CORRECT
    case = Case(Layout.from_lengths([2], [5], 4), Heads(2, 1, 8, 8), Options(causal=True, rope=Rope(rotary_dim=2)), seed=4)
    tensors = make_tensors(case)
    out_a, _ = planted.correct_rope(tensors.q, tensors.k_cache, tensors.v_cache, **_layout_kwargs(case), rope=case.options.rope)
    out_b, _ = planted.rope_pairing_swapped(tensors.q, tensors.k_cache, tensors.v_cache, **_layout_kwargs(case), rope=case.options.rope)
    assert torch.equal(out_a, out_b)  # one rotated pair: both pairings are the same rotation


def _layout_kwargs(case: Case) -> dict:
    lay = case.layout
    index = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    return dict(qo_indptr=index(lay.qo_indptr), kv_indptr=index(lay.kv_indptr), kv_indices=index(lay.kv_indices),
                kv_last_page_len=index(lay.kv_last_page_len), causal=case.options.causal, sm_scale=case.sm_scale,
                window_left=-1, logits_soft_cap=0.0)


def test_pod_splits_a_batch_into_its_prefill_and_decode_requests() -> None:
    from pa_oracle.backends.flashinfer_pod import pod_uri, rows_of, split_requests, sub_layout

    lay = Layout.from_lengths([3, 1, 0, 1], [5, 9, 2, 4], 4, page_order=[3, 0, 1, 6, 2, 5, 4, 7, 8], extra_pages=2)
    prefill, decode = split_requests(lay)
    assert (prefill, decode) == ([0, 2], [1, 3])
    assert sub_layout(lay, decode) == {"qo_indptr": [0, 1, 2], "kv_indptr": [0, 3, 4], "kv_indices": [1, 6, 2, 4],
                                       "kv_last_page_len": [1, 4]}
    assert sub_layout(lay, prefill)["kv_indices"] == [3, 0, 5]
    assert rows_of(lay, prefill) == [0, 1, 2] and rows_of(lay, decode) == [3, 4]
    backend = get_backend("flashinfer-pod")
    key = (("q_dtype", "bfloat16"), ("kv_dtype", "bfloat16"), ("head_dim_qk", 128), ("window", False))
    assert pod_uri(key).startswith("batch_pod_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_head_dim_128_posenc_p_0")
    assert len(backend.modules(key)) == 2 and backend.call_source(Case(lay, Heads(2, 1, 64, 64))) is None
