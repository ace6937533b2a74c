from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pa_oracle.backends import get_backend
from pa_oracle.backends.base import Backend, Part
from pa_oracle.backends.flashinfer_cascade import split_layouts
from pa_oracle.fuzz.checks.composed import COMPOSED_CHECKS, check_parts, part_requests, sub_case
from pa_oracle.fuzz.checks.registry import CHECKS
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.quality import planted_composed
from pa_oracle.oracle.case import Case, Heads, Layout, Options

from tests.fake_kernels import FakeDecodeWrapper, FakePrefillWrapper, _module

CHECK = COMPOSED_CHECKS[0]
# requests 0 and 2 decode (qo_len 1), 1 a prefill whose KV has a full page before its queries
MIXED = Case(Layout.from_lengths([1, 6, 1], [9, 13, 5], 4), Heads(4, 2, 16, 16), Options(causal=True), seed=3)


def test_the_check_is_registered_and_skips_kernels_that_are_not_composed() -> None:
    assert CHECKS["composed-vs-parts"] is CHECK
    assert "not composed" in CHECK.capabilities(get_backend("sdpa-math"))
    assert CHECK.capabilities(get_backend("flashinfer-pod")) == get_backend("flashinfer-pod").capabilities


@pytest.mark.parametrize("name", ["flashinfer-pod", "flashinfer-cascade"])
def test_the_flashinfer_composed_adapters_name_registered_parts_that_cover_every_request(name: str) -> None:
    backend = get_backend(name)
    check_parts(backend)
    for part in backend.parts:
        assert get_backend(part.backend).parts == ()  # uncomposed


def test_a_declaration_that_misses_or_repeats_requests_is_a_tool_error() -> None:
    class Twice(Backend):
        name = "twice"
        parts = (Part("all", "sdpa-math"), Part("decode", "sdpa-math"))

    class Unknown(Backend):
        name = "unknown"
        parts = (Part("long", "sdpa-math"),)

    for backend in (Twice(), Unknown()):
        with pytest.raises(ValueError, match=backend.name):
            CHECK.capabilities(backend)


def test_the_request_sets_partition_the_batch_and_sub_cases_keep_the_pool() -> None:
    lay = MIXED.layout
    assert part_requests(lay, "decode") == [0, 2] and part_requests(lay, "prefill") == [1]
    assert part_requests(lay, "all") == [0, 1, 2]
    sub = sub_case(MIXED, [0, 2])
    assert sub.layout.num_pages == lay.num_pages and sub.layout.kv_lens == (9, 5) and sub.layout.qo_lens == (1, 1)
    assert sub.layout.pages_of(1) == lay.pages_of(2)


@pytest.mark.parametrize("name", ["correct_pod", "correct_cascade"])
def test_a_correct_composition_passes(name: str) -> None:
    outcome = CHECK(getattr(planted_composed, name)(), MIXED)
    assert outcome.status == "pass", outcome.message
    assert [label for label, _, _ in outcome.cases][0] == "original"


def test_swapped_decode_rows_are_caught_on_one_case() -> None:
    outcome = CHECK(planted_composed.pod_swaps_decode_rows(), MIXED)
    assert outcome.status == "fail" and "differ by more than two passing kernels can" in outcome.message, outcome.message
    assert [label for label, _, _ in outcome.cases] == ["original", "part-prefill", "part-decode"]
    assert outcome.worst is not None and MIXED.layout.qo_lens[outcome.worst.request] == 1


def test_a_dropped_prefix_weight_is_caught_on_a_case_with_a_prefix() -> None:
    cut = Case(Layout.from_lengths([2], [13], 4), Heads(2, 1, 16, 16), Options(causal=True), seed=5)
    assert split_layouts(cut)[0].kv_lens == (8,)  # the seed's cut: two pages of prefix
    outcome = CHECK(planted_composed.cascade_drops_prefix_weight(), cut)
    assert outcome.status == "fail", outcome.message
    assert "parts vs oracle: PASS" in outcome.message and "composed vs oracle: FAIL" in outcome.message


# --- the FlashInfer adapters through CPU stand-ins of the library --------------------------------


class _Tuples:
    """The test stand-ins take the combined ``[pages, 2, ...]`` tensor; the adapters pass (k, v)."""

    def run(self, q, paged_kv_cache, **kwargs):  # type: ignore[no-untyped-def]
        kv = torch.stack(paged_kv_cache, 1) if isinstance(paged_kv_cache, tuple) else paged_kv_cache
        out = torch.empty(*q.shape[:2], kv.shape[-1], dtype=q.dtype)
        return super().run(q, kv, out=out, **kwargs)  # type: ignore[misc]


class Prefill(_Tuples, FakePrefillWrapper):
    def plan(self, *args, pos_encoding_mode="NONE", **kwargs):  # type: ignore[no-untyped-def]
        assert pos_encoding_mode == "NONE"
        super().plan(*args, **kwargs)


class Decode(_Tuples, FakeDecodeWrapper):
    pass


class Pod:
    """``BatchPODWithPagedKVCacheWrapper`` from two stand-in wrappers (``swap``: decode rows reversed)."""

    swap = False

    def __init__(self, workspace, kv_layout="NHD"):  # type: ignore[no-untyped-def]
        self.prefill, self.decode = Prefill(workspace, kv_layout), Decode(workspace, kv_layout)

    def plan(self, qo_p, kv_p, idx_p, last_p, qo_d, kv_d, idx_d, last_d, num_qo_heads, num_kv_heads, head_dim, page_size,
             *, pos_encoding_mode, window_left, q_data_type, kv_data_type, sm_scale):  # type: ignore[no-untyped-def]
        assert pos_encoding_mode == "NONE"
        self.prefill_args = (qo_p, kv_p, idx_p, last_p, page_size, sm_scale, window_left)
        self.decode.plan(kv_d, idx_d, last_d, num_qo_heads, num_kv_heads, head_dim, page_size, sm_scale=sm_scale,
                         window_left=window_left)

    def run(self, q_p, kv_p, q_d, kv_d, *, causal_p, return_lse):  # type: ignore[no-untyped-def]
        qo, kv, idx, last, page_size, scale, window = self.prefill_args
        self.prefill._plan(qo, kv, idx, last, page_size, causal_p, scale, window, None)
        out_p, lse_p = self.prefill.run(q_p, kv_p, return_lse=True)
        out_d, lse_d = self.decode.run(q_d, kv_d, return_lse=True)
        if self.swap:
            out_d, lse_d = out_d.flip(0), lse_d.flip(0)
        return (out_p, out_d), (lse_p, lse_d)


class SwappingPod(Pod):
    swap = True


def _merge_state(v_a, s_a, v_b, s_b):  # type: ignore[no-untyped-def]
    """FlashInfer's merge_state: base-2 LSE in and out."""
    m = torch.maximum(s_a, s_b)
    m = torch.where(torch.isinf(m), 0.0, m)
    w_a, w_b = torch.exp2(s_a - m), torch.exp2(s_b - m)
    total = w_a + w_b
    safe = torch.where(total == 0, 1.0, total)
    out = (w_a[..., None] * v_a.double() + w_b[..., None] * v_b.double()) / safe[..., None]
    return out.to(v_a.dtype), torch.where(total == 0, -math.inf, m + torch.log2(safe)).float()


def _flashinfer(pod: type[Pod]):  # type: ignore[no-untyped-def]
    return _module("flashinfer", BatchPrefillWithPagedKVCacheWrapper=Prefill, BatchDecodeWithPagedKVCacheWrapper=Decode,
                   BatchPODWithPagedKVCacheWrapper=pod, merge_state=_merge_state)


@pytest.mark.parametrize("name", ["flashinfer-pod", "flashinfer-cascade"])
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_the_composed_adapters_agree_with_their_parts_through_cpu_stand_ins(name: str, data: st.DataObject) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(__import__("sys").modules, "flashinfer", _flashinfer(Pod))
        backend = get_backend(name)
        for cls in {type(backend), *(type(get_backend(p.backend)) for p in backend.parts)}:
            mp.setattr(cls, "device", property(lambda self: "cpu"))
        limits = Limits(max_batch=4, max_kv_len=40, max_qo_len=8, max_kv_heads=2, max_qo_heads=4)
        caps = CHECK.capabilities(backend)
        assert not isinstance(caps, str)
        case = data.draw(cases(caps.replace(devices=("cpu",), kv_dtypes=None), limits), label="case")
        outcome = CHECK(backend, case)
    if outcome.status == "unsupported":
        assert "POD needs a decode request" in outcome.message, outcome.message
        return
    assert outcome.status == "pass", outcome.message


def test_a_pod_that_swaps_decode_rows_is_caught_through_the_adapter() -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(__import__("sys").modules, "flashinfer", _flashinfer(SwappingPod))
        backend = get_backend("flashinfer-pod")
        for cls in {type(backend), *(type(get_backend(p.backend)) for p in backend.parts)}:
            mp.setattr(cls, "device", property(lambda self: "cpu"))
        case = MIXED.replace(heads=Heads(4, 2, 64, 64), options=Options(causal=True, q_dtype="float16", kv_dtype="float16"))
        outcome = CHECK(backend, case)
    assert outcome.status == "fail" and "differ by more than" in outcome.message, outcome.message


def test_keyless_rows_whose_sentinels_differ_are_the_oracle_checks_not_a_composition_finding(monkeypatch) -> None:
    """The H200's cascade merged two -5e4 sentinel states (LSE +log 2 against its part's): both fail the
    oracle alike on that row, so the check passes and leaves it to the oracle comparison."""
    import math

    import torch
    from pa_oracle.backends.base import KernelOutput
    from pa_oracle.fuzz.checks import composed
    from pa_oracle.oracle.reference import reference
    from pa_oracle.oracle.tensors import make_tensors

    case = Case(Layout.from_lengths([1, 2], [0, 7], 4), Heads(2, 1, 16, 16), Options(causal=True), seed=1)
    ref = reference(case, make_tensors(case))
    lse = ref.lse.float().clone()
    lse[0] = -34655.75  # request 0 has no key
    good = KernelOutput(ref.out.to(torch.float32), lse)
    shifted = KernelOutput(good.out.clone(), lse.clone())
    shifted.lse[0] += math.log(2)
    monkeypatch.setattr(composed, "run_supported", lambda backend, case, tensors, label: good)
    monkeypatch.setattr(composed, "run_parts", lambda backend, case, tensors, like: (shifted, []))
    outcome = CHECK(planted_composed.correct_cascade(), case)
    assert outcome.status == "pass" and "both fail the oracle alike" in outcome.message, outcome.message
    shifted.lse[1] += 1.0  # a row with keys: now the two differ where it counts
    assert CHECK(planted_composed.correct_cascade(), case).status == "fail"
