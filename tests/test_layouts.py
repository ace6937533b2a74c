from __future__ import annotations

import hashlib
import itertools

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from pa_oracle.backends import get_backend
from pa_oracle.backends._dense import to_dense
from pa_oracle.backends.base import Capabilities
from pa_oracle.backends.sdpa import SdpaMath
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
from pa_oracle.fuzz.draw.features import case_features
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.quality import planted, planted_layouts
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import STORAGE_FEATURES, Case, CaseError, Heads, Layout, Options, Storage
from pa_oracle.oracle.reference import reference
from pa_oracle.oracle.tensors import load_case, make_tensors, same_bits, save_case

from tests.fake_kernels import FakeDecodeWrapper, FakePrefillWrapper, _module, fake_fa3_with_kvcache

LAYOUT = Layout.from_lengths([1, 3, 0], [5, 9, 2], 4, page_order=[4, 0, 5, 2, 1, 7, 3, 6], extra_pages=2)
STORAGES = [Storage(kv, layout, q, offset) for kv, layout, q, offset in itertools.product(
    ("separate", "combined"), ("NHD", "HND"), ("contiguous", "fused_qkv"), (0, 448))][1:]  # every one but the default


def _case(storage: Storage | None, **options) -> Case:
    return Case(LAYOUT, Heads(4, 2, 8, 8), Options(**options), seed=5, storage=storage)


def _ids(caps: Capabilities, n: int = 60) -> str:
    ids: list[str] = []

    @settings(max_examples=n, deadline=None, database=None, phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @seed(0)
    @given(cases(caps))
    def draw(case: Case) -> None:
        ids.append(case.case_id)

    draw()
    return hashlib.sha256(",".join(ids).encode()).hexdigest()[:16]


def test_the_default_storage_is_no_storage_and_keeps_every_case_id() -> None:
    plain = _case(None)
    assert _case(Storage()).storage is None and _case(Storage()).case_id == plain.case_id
    assert "storage" not in plain.to_json()
    stored = _case(Storage("combined", "HND", "fused_qkv", 448))
    assert stored.case_id != plain.case_id and Case.from_json(stored.to_json()) == stored
    assert "storage=combined+HND+fused_qkv+pool_offset=448" in stored.summary()


@pytest.mark.parametrize(("storage", "message"), [
    ({"kv": "packed"}, "storage.kv must be one of"), ({"pool_offset": 3}, "multiple of 64"),
    ({"pool_offset": True}, "storage.pool_offset: expected int"), ({"q": 1}, "storage.q: expected str"),
    ({"layout": "NHD"}, "storage.layout: unknown field"),
])
def test_a_bad_storage_names_its_field(storage: dict, message: str) -> None:
    data = _case(None).to_json() | {"storage": storage}
    data.pop("case_id")
    with pytest.raises(CaseError, match=message):
        Case.from_json(data)


def test_mla_keeps_its_latent_layout_and_combined_needs_equal_dims() -> None:
    mla = Heads(2, 1, 12, 8, mla=True)
    with pytest.raises(CaseError, match="MLA case keeps its latent layout"):
        Case(LAYOUT, mla, storage=Storage(kv_layout="HND"))
    with pytest.raises(CaseError, match="needs head_dim_qk == head_dim_vo"):
        Case(LAYOUT, Heads(2, 1, 8, 16), storage=Storage(kv="combined"))
    case = Case(LAYOUT, mla, seed=2, storage=Storage(q="fused_qkv", pool_offset=64))
    tensors, plain = make_tensors(case), make_tensors(case.replace(storage=None))
    assert tensors.v_is_latent_view() and tensors.q.stride(0) == 3 * 12
    assert all(same_bits(getattr(plain, n), getattr(tensors, n)) for n in ("q", "k_cache", "v_cache"))


@pytest.mark.parametrize("kv_dtype", ["float32", "float8_e4m3fn"])
@pytest.mark.parametrize("storage", STORAGES, ids=lambda s: s.label())
def test_every_storage_holds_the_same_bits_and_poison_around_them(storage: Storage, kv_dtype: str) -> None:
    plain, stored = _case(None, kv_dtype=kv_dtype), _case(storage, kv_dtype=kv_dtype)
    a, b = make_tensors(plain), make_tensors(stored)
    for name in ("q", "k_cache", "v_cache"):
        assert same_bits(getattr(a, name), getattr(b, name)), name
    assert b.k_cache.shape == a.k_cache.shape and (b.k_cache.is_contiguous() == (storage.kv_layout == "NHD" and storage.kv == "separate"))
    assert b.q.is_contiguous() == (storage.q == "contiguous")
    pool = b.pool.float()
    referenced = 2 * sum(LAYOUT.kv_lens) * 2 * 8  # K and V: tokens x heads x dims
    assert int(torch.isfinite(pool).sum()) == referenced  # everything else in the pool is poison
    assert torch.isnan(pool[: storage.pool_offset]).all() and torch.isnan(pool[pool.numel() - storage.pool_offset :]).all()
    if storage.kv == "combined":
        assert b.paged_kv(storage.kv_layout) is b.kv_cache and b.kv_cache.shape[1] == 2
        assert b.kv_cache[:, 0].data_ptr() == b.k_cache.data_ptr() and b.kv_cache[:, 1].data_ptr() == b.v_cache.data_ptr()
    torch.testing.assert_close(reference(stored, b)[0], reference(plain, a)[0], rtol=0, atol=0)


@pytest.mark.parametrize("storage", [Storage("combined", "HND", pool_offset=64), Storage(q="fused_qkv")], ids=lambda s: s.label())
def test_the_fingerprint_covers_the_whole_buffers(storage: Storage) -> None:
    tensors = make_tensors(_case(storage))
    before = tensors.fingerprint()
    assert set(before) == ({"q_buffer"} if storage.q == "fused_qkv" else {"q"}) | {"kv_pool"}
    if storage.q == "fused_qkv":
        tensors.q_buffer[0, -1] = 1.0  # a K/V column of the fused buffer: outside q's view
        assert tensors.fingerprint()["q_buffer"] != before["q_buffer"]
    else:
        tensors.pool[0] = 1.0  # inside the offset region: outside every view
        assert tensors.fingerprint()["kv_pool"] != before["kv_pool"]


def test_moving_tensors_keeps_their_storage() -> None:
    tensors = make_tensors(_case(Storage("combined", "HND", "fused_qkv", 448)))
    moved = tensors.to("meta")
    assert moved.pool.device.type == "meta" and moved.storage == tensors.storage
    for name in ("q", "k_cache", "v_cache", "kv_cache"):
        old, new = getattr(tensors, name), getattr(moved, name)
        base = tensors.q_buffer if name == "q" else tensors.pool
        new_base = moved.q_buffer if name == "q" else moved.pool
        assert new.shape == old.shape and new.stride() == old.stride(), name
        assert new.storage_offset() - new_base.storage_offset() == old.storage_offset() - base.storage_offset(), name


def test_a_sidecar_case_holds_logical_tensors_and_gets_its_storage_on_load(tmp_path) -> None:
    case = _case(Storage("combined", "HND", "fused_qkv", 64))
    saved = save_case(case, tmp_path / "c")
    loaded = load_case(tmp_path / "c" / "case.json")
    assert loaded.storage == case.storage and loaded.case_id == saved.case_id
    tensors, expected = make_tensors(loaded), make_tensors(case)
    assert tensors.kv_cache is not None and tensors.q_buffer is not None
    assert all(same_bits(getattr(expected, n), getattr(tensors, n)) for n in ("q", "k_cache", "v_cache"))


def test_only_kernels_that_declare_a_storage_draw_one() -> None:
    # (that the others draw exactly the cases they drew before storages existed: tests/test_same_draws.py)
    assert get_backend("sdpa-math").capabilities.storages == ("contiguous",)
    assert "HND" in get_backend("flashinfer-decode").capabilities.storages


def test_storages_are_drawn_only_from_what_the_kernel_declares() -> None:
    seen: list[Storage | None] = []
    caps = Capabilities(storages=("combined", "pool_offset"), mla=(False, True), mla_dims=((12, 8),))

    @seed(0)  # the coverage claim after the draws must not depend on a random seed
    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(cases(caps, Limits(max_batch=2, max_kv_len=20)))
    def draw(case: Case) -> None:
        seen.append(case.storage)
        assert case.storage is not None  # "contiguous" is not declared: pool_offset applies to every case
        if case.storage is not None:
            assert set(case.storage.features) <= {"combined", "pool_offset"}
            assert not (case.heads.mla and case.storage.kv == "combined")
            assert case_features(case)["pool_offset"] == case.storage.pool_offset

    draw()
    assert {s.kv for s in seen if s} == {"separate", "combined"} and any(s and s.pool_offset for s in seen)


def test_a_storage_the_kernel_does_not_declare_is_unsupported() -> None:
    outcome = check_case(SdpaMath(), _case(Storage(kv_layout="HND")))
    assert outcome.status == "unsupported" and "storage HND not in ('contiguous',)" in outcome.message


def test_the_dense_gather_reads_through_the_views() -> None:
    plain = _case(None)
    expected = SdpaMath().run(plain, make_tensors(plain)).out
    for storage in STORAGES:
        case = _case(storage)
        tensors = make_tensors(case)
        dense = to_dense(case, tensors)
        assert torch.isfinite(dense.k).all() and torch.isfinite(dense.v).all()
        assert torch.equal(SdpaMath().run(case, tensors).out, expected), storage


# --- planted layout bugs -------------------------------------------------------------------


@pytest.mark.parametrize("bug", sorted(planted_layouts.BUGS))
def test_a_planted_layout_bug_is_caught_within_300_cpu_examples(bug: str) -> None:
    kernel = UserKernel(getattr(planted_layouts, bug), name=f"pa_oracle.fuzz.quality.planted_layouts:{bug}")
    small = Limits(max_batch=3, max_kv_len=48, max_qo_len=8, max_kv_heads=2, max_qo_heads=8)  # quick to shrink
    result = fuzz_backend(kernel, CampaignConfig(examples=300, seed=0, isolate=False, limits=small))
    assert result.finding is not None and result.examples <= 300, f"{bug} not caught in 300 examples"
    case = result.finding.case
    assert case.storage is not None, case.summary()  # the storage is what it fails on...
    assert check_case(kernel, case.replace(storage=None)).status == "pass"  # ...the same case without it passes


WRONG_ON = {  # what each bug must fail on (a case with more than one page and one kv head)
    "reads_caches_as_contiguous": lambda s: s.kv == "combined" or s.kv_layout == "HND" or s.q == "fused_qkv",
    "ignores_storage_offset": lambda s: True,  # every storage puts the caches in one pool: V never starts it
    "hnd_read_as_nhd": lambda s: s.kv_layout == "HND",
}


@pytest.mark.parametrize("storage", STORAGES, ids=lambda s: s.label())
def test_correct_kernels_pass_every_storage_and_the_bugs_fail_where_they_should(storage: Storage) -> None:
    case = _case(storage, causal=True)
    for name in planted_layouts.CORRECT:
        outcome = check_case(UserKernel(getattr(planted_layouts, name)), case)
        assert outcome.status == "pass", f"{name}: {outcome.message}"
    for bug, wrong in WRONG_ON.items():
        status = check_case(UserKernel(getattr(planted_layouts, bug)), case).status
        assert status == ("fail" if wrong(storage) else "pass"), (bug, status)


def test_every_planted_kernel_declares_every_storage() -> None:
    for name in (*planted_layouts.BUGS, *planted_layouts.CORRECT):
        assert UserKernel(getattr(planted_layouts, name)).capabilities.storages == STORAGE_FEATURES, name
    assert not set(planted_layouts.BUGS) & set(planted.BUGS)  # the selftest runs both modules' kernels by name


# --- adapters: the library's own form, no copy (CPU stand-ins that read as the library does) ----------


class _Received:
    calls: list[dict] = []


def _unpack(paged_kv_cache, kv_layout: str):  # FlashInfer's _unpack_paged_kv_cache, then NHD-indexed
    k, v = paged_kv_cache.unbind(1) if isinstance(paged_kv_cache, torch.Tensor) else paged_kv_cache
    assert k.stride() == v.stride() and k.stride(-1) == 1  # batch_decode.cu: K/V strides must match
    return (k.transpose(1, 2), v.transpose(1, 2)) if kv_layout == "HND" else (k, v)


def _layout_aware(base):  # type: ignore[no-untyped-def]
    class Wrapper(base):
        def __init__(self, workspace, kv_layout="NHD", use_tensor_cores=False, backend="auto"):
            self.kv_layout = kv_layout

        def plan(self, *args, pos_encoding_mode="NONE", **kwargs):
            assert pos_encoding_mode == "NONE"  # the stand-ins have no ALiBi
            return super().plan(*args, **kwargs)

        def run(self, q, paged_kv_cache, *, k_scale=None, v_scale=None, out=None, return_lse=False):
            k, v = _unpack(paged_kv_cache, self.kv_layout)
            _Received.calls.append({"kv_layout": self.kv_layout, "single": isinstance(paged_kv_cache, torch.Tensor),
                                    "kv_storage": k.untyped_storage().data_ptr(), "q_storage": q.untyped_storage().data_ptr()})
            out = torch.empty(*q.shape[:2], v.shape[-1], dtype=q.dtype) if out is None else out
            return super().run(q, torch.stack((k, v), 1), k_scale=k_scale, v_scale=v_scale, out=out, return_lse=return_lse)

    return Wrapper


def _fa2_with_kvcache(q, k_cache, v_cache, *, cache_seqlens, block_table, softmax_scale, causal, window_size, softcap,
                      alibi_slopes, num_splits, return_softmax_lse):
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and alibi_slopes is None
    _Received.calls.append({"kv_storage": k_cache.untyped_storage().data_ptr(), "q_storage": q.untyped_storage().data_ptr()})
    batch, seqlen_q = q.shape[:2]
    out, lse = fake_fa3_with_kvcache(
        q.flatten(0, 1), k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=block_table,
        cu_seqlens_q=torch.arange(batch + 1) * seqlen_q, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, softcap=softcap, return_softmax_lse=True)
    return out.view(batch, seqlen_q, *out.shape[1:]), lse.view(lse.shape[0], batch, seqlen_q).transpose(0, 1)


@pytest.mark.parametrize("name", ["flashinfer-decode", "flashinfer-decode-tc", "flashinfer-prefill-fa2", "flash-attn-kvcache-paged"])
@pytest.mark.parametrize("storage", [Storage("combined", "HND", "fused_qkv", 448), Storage(kv_layout="HND", pool_offset=64),
                                     Storage("combined"), Storage(q="fused_qkv")], ids=lambda s: s.label())
def test_adapters_hand_the_library_its_own_form_without_a_copy(name: str, storage: Storage, monkeypatch) -> None:
    flashinfer = _module("flashinfer", BatchPrefillWithPagedKVCacheWrapper=_layout_aware(FakePrefillWrapper),
                         BatchDecodeWithPagedKVCacheWrapper=_layout_aware(FakeDecodeWrapper))
    monkeypatch.setitem(__import__("sys").modules, "flashinfer", flashinfer)
    monkeypatch.setitem(__import__("sys").modules, "flash_attn", _module("flash_attn", flash_attn_with_kvcache=_fa2_with_kvcache))
    backend = get_backend(name)
    monkeypatch.setattr(type(backend), "device", property(lambda self: "cpu"))
    assert set(storage.features) <= set(backend.capabilities.storages)
    page = 256 if name.startswith("flash-attn") else 16
    decode = "decode" in name
    kv_lens = [300, 40]
    pages = sum(-(-n // page) for n in kv_lens) + 1
    layout = Layout.from_lengths([1, 1] if decode or name.startswith("flash-attn") else [2, 3], kv_lens, page,
                                 page_order=list(reversed(range(pages))), extra_pages=1)
    case = Case(layout, Heads(4, 2, 64, 64), Options(q_dtype="float16", kv_dtype="float16", causal=not decode), seed=1, storage=storage)
    tensors = make_tensors(case)
    _Received.calls = []
    out = backend.run(backend.plan(case), tensors)
    call = _Received.calls[-1]
    assert call["kv_storage"] == tensors.pool.untyped_storage().data_ptr()  # the pool itself, no copy
    assert call["q_storage"] == (tensors.q_buffer if storage.q == "fused_qkv" else tensors.q).untyped_storage().data_ptr()
    if name.startswith("flashinfer"):
        assert call["kv_layout"] == storage.kv_layout and call["single"] == (storage.kv == "combined")
    assert out.out.shape == (layout.total_q, 4, 64) and torch.isfinite(out.out).all()
    outcome = check_case(backend, case)  # the whole judge: the oracle, the tolerance model, the fingerprints
    assert outcome.status == "pass", outcome.message


def test_triage_says_when_a_failure_needs_its_storage() -> None:
    from functools import partial

    from pa_oracle.fuzz.triage.necessity import necessary_options

    kernel = UserKernel(planted_layouts.hnd_read_as_nhd)
    needed = necessary_options(_case(Storage(kv_layout="HND"), causal=True), kernel, partial(check_case, kernel))
    assert needed.result == "pattern" and "storage HND" in needed.finding, needed
