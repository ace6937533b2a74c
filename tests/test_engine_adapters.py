from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pa_oracle.backends import discover, get_backend
from pa_oracle.backends.flash_attn import _window
from pa_oracle.backends.flash_attn4 import fa4_window
from pa_oracle.backends.sglang_extend import capabilities_for, extend_indices, signature_mismatch
from pa_oracle.backends.vllm_triton import vllm_window_size
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.oracle.case import Case, Heads, Layout, Options, alibi_slopes
from pa_oracle.oracle.tensors import token_addresses

NEW = {
    "vllm-flashinfer": "flashinfer",
    "sglang-extend": "sglang",
    "vllm-triton": "vllm",
    "flash-attn3-paged": "flash_attn_interface",
    "flash-attn3-paged-split4": "flash_attn_interface",
    "flash-attn3-paged-aot": "flash_attn_interface",
    "flash-attn3-varlen": "flash_attn_interface",
    "flash-attn4-varlen": "flash_attn.cute",
    "flash-attn4-paged": "flash_attn.cute",
}
# a rule beyond the Capabilities fields, stated in the adapter's own unsupported_reason
EXTRA_RULES = {"sglang-extend": "window_left=0", "vllm-triton": "ALiBi + sinks"}

BF16 = {"q_dtype": "bfloat16", "kv_dtype": "bfloat16"}


def _case(qo_lens: list[int], kv_lens: list[int], page: int = 16, heads: Heads = Heads(4, 2, 128, 128), **options) -> Case:
    return Case(Layout.from_lengths(qo_lens, kv_lens, page), heads, Options(**{**BF16, **options}))


def test_new_adapters_are_registered_with_descriptions() -> None:
    registry = discover()
    assert set(NEW) <= set(registry)
    assert all(registry[name].description for name in NEW)


@pytest.mark.parametrize("name", sorted(NEW))
def test_unavailable_reason_names_the_missing_package(name: str) -> None:
    backend = get_backend(name)
    reason = backend.unavailable_reason()
    if reason is None:
        pytest.skip(f"{name} is available here")
    if NEW[name] in reason:
        return
    assert "needs one of devices" in reason or "needs sm" in reason, f"{name}: {reason}"


def test_vllm_flashinfer_declares_the_engine_invariants() -> None:
    backend = get_backend("vllm-flashinfer")
    mixed = _case([1, 7, 1, 3], [40, 7, 17, 90], causal=True, window_left=20, logits_soft_cap=30.0)
    assert backend.unsupported_reason(mixed) is None
    fp8 = _case([1, 5], [9, 33], causal=True, kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=2.0)
    assert backend.unsupported_reason(fp8) is None
    for bad, why in [
        (_case([3], [2], causal=True), "qo_len > kv_len"),
        (_case([0, 1], [5, 5], causal=True), "qo_len < 1"),
        (_case([1], [9], page=8, causal=True), "page_size 8"),
        (_case([1], [9]), "causal=False"),
        (_case([2], [9], causal=True, alibi_slopes=alibi_slopes(4)), "alibi"),
        (_case([1], [9], causal=True, sinks=(0.0,) * 4), "sinks"),
    ]:
        assert why in (backend.unsupported_reason(bad) or ""), why


def test_vllm_triton_rejects_alibi_with_sinks_and_small_heads() -> None:
    backend = get_backend("vllm-triton")
    assert backend.unsupported_reason(_case([2, 1], [9, 4], causal=True, alibi_slopes=alibi_slopes(4))) is None
    both = _case([2], [9], causal=True, alibi_slopes=alibi_slopes(4), sinks=(1.0,) * 4)
    assert "ALiBi + sinks" in (backend.unsupported_reason(both) or "")
    assert "page_size % 16" in (backend.unsupported_reason(_case([1], [9], page=24, causal=True)) or "")
    assert "head_dim 16" in (backend.unsupported_reason(_case([1], [9], heads=Heads(2, 1, 16, 16), causal=True)) or "")


def test_sglang_extend_window_and_fp8_follow_the_kernel() -> None:
    backend = get_backend("sglang-extend")
    assert backend.unsupported_reason(_case([3, 0], [9, 4], window_left=1, causal=True)) is None
    assert "window_left=0" in (backend.unsupported_reason(_case([3], [9], window_left=0)) or "")
    assert "qo_len > kv_len" in (backend.unsupported_reason(_case([5], [4])) or "")
    assert "head_dim 8" in (backend.unsupported_reason(_case([1], [4], heads=Heads(2, 1, 8, 8))) or "")
    fp8 = _case([2], [9], kv_dtype="float8_e5m2", k_scale=0.5)
    assert capabilities_for({"k_extend", "sinks"}).unsupported_reason(fp8) is not None
    assert capabilities_for({"k_extend", "sinks", "k_scale", "v_scale"}).unsupported_reason(fp8) is None


def test_flash_attn3_and_4_head_dims_and_options() -> None:
    fa3, fa4 = get_backend("flash-attn3-paged"), get_backend("flash-attn4-varlen")
    assert fa3.unsupported_reason(_case([3, 1], [2, 5], page=3, heads=Heads(4, 1, 40, 40), causal=True)) is None
    assert "head_dim 36" in (fa3.unsupported_reason(_case([1], [5], heads=Heads(1, 1, 36, 36))) or "")
    assert "alibi" in (fa3.unsupported_reason(_case([1], [5], alibi_slopes=alibi_slopes(4))) or "")
    assert fa4.unsupported_reason(_case([2], [5], heads=Heads(4, 2, 64, 64), sinks=(1.0, 0.0, -2.0, 4.0))) is None
    assert "head_dim 80" in (fa4.unsupported_reason(_case([1], [5], heads=Heads(1, 1, 80, 80))) or "")


def _extend_0_5(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
                custom_mask, is_causal, mask_indptr, max_len_extend, k_scale, v_scale, sm_scale=None, logit_cap=0.0,
                skip_prefix_custom_mask=True, sliding_window_size=-1, sinks=None, window_kv_offsets=None,
                xai_temperature_len=-1): ...


def _extend_req_to_tokens(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, req_to_tokens, b_req_idx,
                          b_seq_len, b_seq_len_extend, b_start_loc_extend, max_len_extend, sm_scale=None,
                          logit_cap=0.0): ...


def test_sglang_extend_checks_the_installed_signature() -> None:
    assert signature_mismatch(_extend_0_5) is None
    assert "takes no ['custom_mask', 'is_causal'" in (signature_mismatch(_extend_req_to_tokens) or "")

    def _with_required(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
                       custom_mask, is_causal, mask_indptr, max_len_extend, sm_scale, logit_cap, sliding_window_size,
                       sinks, window_kv_offsets): ...

    assert "requires ['window_kv_offsets']" in (signature_mismatch(_with_required) or "")


@pytest.mark.parametrize("name", sorted(NEW))
@settings(max_examples=25)
@given(data=st.data())
def test_strategies_draw_only_what_the_adapter_admits(name: str, data: st.DataObject) -> None:
    backend = get_backend(name)
    case = data.draw(cases(backend.capabilities.replace(devices=("cpu",)), Limits(max_batch=4, max_kv_len=64)), label="case")
    reason = backend.unsupported_reason(case)
    assert reason is None or (name in EXTRA_RULES and EXTRA_RULES[name] in reason), reason


@settings(max_examples=150)
@given(case=cases(capabilities_for(()).replace(devices=("cpu",)), Limits(max_batch=5, max_kv_len=70)))
def test_extend_indices_split_each_request_into_prefix_then_extend(case: Case) -> None:
    lay = case.layout
    idx = extend_indices(case)
    pages, slots = token_addresses(case)
    flat = (pages * lay.page_size + slots).tolist()
    start = extend_start = 0
    for b, (qo_len, kv_len) in enumerate(zip(lay.qo_lens, lay.kv_lens)):
        prefix = idx.kv_indices[idx.kv_indptr[b] : idx.kv_indptr[b + 1]]
        extend = idx.extend_slots[extend_start : extend_start + qo_len]
        assert len(prefix) == kv_len - qo_len and extend_start == lay.qo_indptr[b]
        assert list(prefix) + list(extend) == flat[start : start + kv_len], f"request {b}"
        start += kv_len
        extend_start += qo_len
    assert len(idx.extend_slots) == lay.total_q


def _oracle_sees(p: int, j: int, causal: bool, w: int) -> bool:
    return (not causal or j <= p) and (w < 0 or j >= p - w)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("w", [-1, 0, 1, 2, 5])
def test_window_translations_match_the_oracle_rule(causal: bool, w: int) -> None:
    case = _case([1], [1], causal=causal, window_left=w)
    left, right = _window(case)  # flash-attn 2/3: keys in [p - left, p + right], -1 open
    left4, right4 = fa4_window(case)  # flash-attn 4: None open
    sliding = 1 + vllm_window_size(w)[0]  # vLLM: q - k < SLIDING_WINDOW when > 0, always causal
    for p in range(8):
        for j in range(12):
            expected = _oracle_sees(p, j, causal, w)
            fa = (left < 0 or j >= p - left) and (right < 0 or j <= p + right)
            fa4 = (left4 is None or j >= p - left4) and (right4 is None or j <= p + right4)
            assert fa == expected and fa4 == expected, (p, j)
            if causal:
                assert ((j <= p) and (sliding <= 0 or p - j < sliding)) == expected, (p, j)
            if w != 0:  # SGLang: q <= k + W, only for W > 0 (window_left=0 is declared unsupported)
                assert ((not causal or j <= p) and (w <= 0 or p <= j + w)) == expected, (p, j)
