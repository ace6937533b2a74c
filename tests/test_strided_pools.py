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
from pa_oracle.fuzz.campaign import engine
from pa_oracle.fuzz.draw.determinism import seed_only_draws
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.quality import planted_layouts
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import ALL_STORAGE_FEATURES, STORAGE_FEATURES, Case, CaseError, Heads, Layout, Options, Storage
from pa_oracle.oracle.reference import reference
from pa_oracle.oracle.tensors import load_case, make_tensors, pool_layout, same_bits, save_case

LAYOUT = Layout.from_lengths([1, 3, 0], [5, 9, 2], 4, page_order=[4, 0, 5, 2, 1, 7, 3, 6], extra_pages=2)
HEADS = Heads(4, 2, 8, 8)
STRIDED = [
    Storage(page_padding=64), Storage(kv_layout="HND", page_padding=448, pool_offset=64),
    Storage("combined", page_padding=64), Storage("combined", "HND", "fused_qkv", 64, page_padding=64),
    Storage(layers=3, layer=1), Storage("combined", layers=2, layer=1), Storage("combined", "HND", layers=3, layer=2, page_padding=64),
    Storage(kv_layout="HND", layers=2, layer=0), Storage(dim_stride=2), Storage("combined", "HND", dim_stride=2, layers=2, layer=1),
    Storage(kv_layout="HND", dim_stride=3, page_padding=64, pool_offset=448),
]
DENSE = [Storage(kv, layout, q, offset) for kv, layout, q, offset in itertools.product(
    ("separate", "combined"), ("NHD", "HND"), ("contiguous", "fused_qkv"), (0, 448))][1:]
SMALL = Limits(max_batch=3, max_kv_len=48, max_qo_len=8, max_kv_heads=2, max_qo_heads=8)  # quick to shrink


def _case(storage: Storage | None, heads: Heads = HEADS, **options) -> Case:
    return Case(LAYOUT, heads, Options(**options), seed=5, storage=storage)


def _campaign(kernel: UserKernel, examples: int) -> engine.BackendResult:
    config = getattr(engine, "CampaignConfig", None)  # the engine's configuration object, where it has one
    if config is None:
        return engine.fuzz_backend(kernel, examples=examples, base_seed=0, isolate=False, limits=SMALL)
    return engine.fuzz_backend(kernel, config(examples=examples, seed=0, isolate=False, limits=SMALL))


# --- the case model -------------------------------------------------------------------------------


def test_strided_fields_are_left_out_when_off_so_every_id_stays() -> None:
    dense = _case(Storage("combined", "HND", "fused_qkv", 448))
    assert set(dense.to_json()["storage"]) == {"kv", "kv_layout", "q", "pool_offset"}
    assert dense.case_id == _case(Storage("combined", "HND", "fused_qkv", 448, 0, 1, 0, 1)).case_id
    strided = _case(Storage("combined", layers=3, layer=2, page_padding=64, dim_stride=2))
    assert strided.to_json()["storage"] == {"kv": "combined", "kv_layout": "NHD", "q": "contiguous", "pool_offset": 0,
                                            "page_padding": 64, "layers": 3, "layer": 2, "dim_stride": 2}
    assert Case.from_json(strided.to_json()) == strided and strided.case_id != dense.case_id
    assert strided.storage.features == ("combined", "padded_pages", "cross_layer", "dim_stride")
    assert "storage=combined+padded_pages=64+cross_layer=2/3+dim_stride=2" in strided.summary()
    assert _case(Storage(layers=1, layer=0, page_padding=0, dim_stride=1)).storage is None


@pytest.mark.parametrize(("storage", "message"), [
    ({"page_padding": 10}, "storage.page_padding must be a multiple of 64"), ({"layers": 0}, "storage.layers must be >= 1"),
    ({"layers": 2, "layer": 2}, r"storage.layer must be <= 1"), ({"dim_stride": 0}, "storage.dim_stride must be >= 1"),
    ({"dim_stride": 9}, "storage.dim_stride must be <= 8"), ({"layers": "2"}, "storage.layers: expected int"),
    ({"page_padding": True}, "storage.page_padding: expected int"),
])
def test_a_bad_strided_field_is_named(storage: dict, message: str) -> None:
    data = _case(None).to_json() | {"storage": storage}
    data.pop("case_id")
    with pytest.raises(CaseError, match=message):
        Case.from_json(data)


# --- the tensors and the oracle -------------------------------------------------------------------


def _expected_page_stride(storage: Storage, heads: Heads) -> int:
    page = LAYOUT.page_size * heads.num_kv_heads * storage.dim_stride
    one_stream = storage.kv == "combined" or storage.layers > 1 or heads.mla
    per_layer = page * (heads.head_dim_qk + (0 if heads.mla else heads.head_dim_vo)) if one_stream else page * heads.head_dim_qk
    return storage.layers * per_layer + storage.page_padding


@pytest.mark.parametrize("kv_dtype", ["float32", "float8_e4m3fn"])
@pytest.mark.parametrize("storage", STRIDED, ids=lambda s: s.label())
def test_a_strided_pool_holds_the_same_values_its_page_stride_and_poison_elsewhere(storage: Storage, kv_dtype: str) -> None:
    plain, stored = _case(None, kv_dtype=kv_dtype), _case(storage, kv_dtype=kv_dtype)
    a, b = make_tensors(plain), make_tensors(stored)
    for name in ("q", "k_cache", "v_cache"):
        assert same_bits(getattr(a, name), getattr(b, name)), name
    assert b.k_cache.stride(0) == b.v_cache.stride(0) == _expected_page_stride(storage, HEADS)
    assert b.k_cache.stride(-1) == b.v_cache.stride(-1) == storage.dim_stride
    if storage.kv == "combined":
        assert b.kv_cache.stride(0) == b.k_cache.stride(0) and b.kv_cache[:, 1].data_ptr() == b.v_cache.data_ptr()
    pool = b.pool.float()
    referenced = 2 * sum(LAYOUT.kv_lens) * HEADS.num_kv_heads * HEADS.head_dim_qk
    assert int(torch.isfinite(pool).sum()) == referenced  # padding, other layers, the interleave: all poison
    assert pool.numel() >= LAYOUT.num_pages * _expected_page_stride(storage, HEADS)
    torch.testing.assert_close(reference(stored, b)[0], reference(plain, a)[0], rtol=0, atol=0)
    assert torch.equal(to_dense(stored, b).k, to_dense(plain, a).k)


@pytest.mark.parametrize("storage", [Storage(page_padding=64), Storage(layers=3, layer=2, dim_stride=2, q="fused_qkv")],
                         ids=lambda s: s.label())
def test_mla_keeps_its_latent_view_in_a_strided_pool(storage: Storage) -> None:
    mla = Heads(2, 1, 12, 8, mla=True)
    a, b = make_tensors(_case(None, mla)), make_tensors(_case(storage, mla))
    assert b.v_is_latent_view() and b.k_cache.stride(0) == _expected_page_stride(storage, mla)
    assert all(same_bits(getattr(a, n), getattr(b, n)) for n in ("q", "k_cache", "v_cache"))
    assert int(torch.isfinite(b.pool.float()).sum()) == sum(LAYOUT.kv_lens) * 12


def test_separate_caches_of_different_head_dims_keep_each_their_page_stride() -> None:
    heads = Heads(4, 2, 8, 16)
    tensors = make_tensors(_case(Storage(page_padding=64, pool_offset=64), heads))
    page = LAYOUT.page_size * heads.num_kv_heads
    assert (tensors.k_cache.stride(0), tensors.v_cache.stride(0)) == (page * 8 + 64, page * 16 + 64)
    where = pool_layout(Storage(layers=2, layer=1), tuple(tensors.k_cache.shape), 16)  # cross-layer: K and V side by side
    assert where.k_page_stride == where.v_page_stride == 2 * page * 24 and where.v_start == where.k_start + page * 8


def test_the_padding_and_the_other_layers_are_in_the_fingerprint_and_kept_by_copies() -> None:
    tensors = make_tensors(_case(Storage("combined", "HND", layers=2, layer=1, page_padding=64)))
    before = tensors.fingerprint()
    copy, moved = tensors.copy(), tensors.to("meta")
    for name in ("k_cache", "v_cache", "kv_cache"):
        assert getattr(copy, name).stride() == getattr(moved, name).stride() == getattr(tensors, name).stride(), name
    assert same_bits(copy.pool, tensors.pool) and copy.pool.data_ptr() != tensors.pool.data_ptr()
    tensors.pool[tensors.k_cache.storage_offset() - 1] = 1.0  # layer 0 of the first page: outside every view
    assert tensors.fingerprint()["kv_pool"] != before["kv_pool"]


def test_a_sidecar_case_gets_its_strided_pool_on_load(tmp_path) -> None:
    case = _case(Storage("combined", layers=3, layer=1, page_padding=64, dim_stride=2))
    saved = save_case(case, tmp_path / "c")
    loaded = load_case(tmp_path / "c" / "case.json")
    assert loaded.storage == case.storage and loaded.case_id == saved.case_id
    tensors = make_tensors(loaded)
    assert tensors.k_cache.stride(-1) == 2 and same_bits(tensors.k_cache, make_tensors(case).k_cache)


# --- the draws ------------------------------------------------------------------------------------


def _hash(caps: Capabilities, n: int = 60) -> str:
    seen: list[str] = []

    @seed(1234)
    @settings(max_examples=n, database=None, deadline=None, phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(cases(caps, Limits()))
    def take(case: Case) -> None:
        seen.append(case.case_id + (case.storage.label() if case.storage else ""))

    with seed_only_draws():
        take()
    return hashlib.sha256("".join(seen).encode()).hexdigest()[:12]


# drawn with every declared storage (not narrowed) on main at 22ddeee, before the strided pools existed
UNCHANGED = {"flashinfer-decode": "6c6727456aa8", "flashinfer-prefill-fa3": "425cbcd4aa98",
             "flash-attn-kvcache-paged": "bb6cf302c346", "sdpa-efficient": "dbfb81922d02"}
USER_VIEWS_BY_DEFAULT = "5dc530264523"  # a user kernel that declares no storage (views by default)


def test_kernels_that_declare_no_strided_pool_draw_what_they_drew_before() -> None:
    assert {name: _hash(get_backend(name).capabilities) for name in UNCHANGED} == UNCHANGED
    assert _hash(UserKernel(planted_layouts.correct_any_storage).capabilities) == USER_VIEWS_BY_DEFAULT
    assert "padded_pages" not in STORAGE_FEATURES and set(ALL_STORAGE_FEATURES) - set(STORAGE_FEATURES) == {
        "padded_pages", "cross_layer", "dim_stride"}


def test_a_kernel_that_declares_the_strided_pools_draws_each_and_only_what_it_declares() -> None:
    seen: list[Storage | None] = []
    caps = Capabilities(storages=("contiguous", "padded_pages", "cross_layer", "dim_stride", "combined"),
                        mla=(False, True), mla_dims=((12, 8),))

    @seed(0)
    @settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(cases(caps, Limits(max_batch=2, max_kv_len=20)))
    def draw(case: Case) -> None:
        seen.append(case.storage)
        if case.storage is not None:
            assert set(case.storage.features) <= set(caps.storages)
            assert not (case.heads.mla and case.storage.kv == "combined")
            assert 0 <= case.storage.layer < case.storage.layers

    draw()
    storages = [s for s in seen if s is not None]
    assert {s.page_padding for s in storages} >= {0, 64, 448} and {s.layers for s in storages} >= {1, 2, 3}
    assert {s.dim_stride for s in storages} == {1, 2} and any(s.layer for s in storages) and None in seen


# --- planted bugs ---------------------------------------------------------------------------------


WRONG_ON = {  # where each strided bug must fail (a case with more than one page, head and dim)
    "dense_page_stride": lambda s: s.page_padding > 0 or s.layers > 1,
    "ignores_dim_stride": lambda s: s.dim_stride > 1,
}


@pytest.mark.parametrize("storage", [*STRIDED, *DENSE], ids=lambda s: s.label())
def test_strided_bugs_fail_only_on_their_pools_and_the_correct_kernels_pass_every_storage(storage: Storage) -> None:
    case = _case(storage, causal=True)
    for name in (*planted_layouts.STRIDED_CORRECT, *planted_layouts.CORRECT):
        kernel = UserKernel(getattr(planted_layouts, name))
        kernel.capabilities = kernel.capabilities.replace(storages=ALL_STORAGE_FEATURES)  # the dense ones too
        outcome = check_case(kernel, case)
        assert outcome.status == "pass", f"{name}: {outcome.message}"
    for bug, wrong in WRONG_ON.items():
        status = check_case(UserKernel(getattr(planted_layouts, bug)), case).status
        assert status == ("fail" if wrong(storage) else "pass"), (bug, status)


def test_the_strided_kernels_are_listed_for_the_selftest() -> None:
    listed = planted_layouts.STRIDED
    assert listed.__name__ == planted_layouts.__name__ and listed.PLANTED == tuple(WRONG_ON)
    for name in (*listed.PLANTED, *listed.CORRECT):
        assert UserKernel(getattr(listed, name)).capabilities.storages == ALL_STORAGE_FEATURES, name
    assert not set(listed.PLANTED) & set(planted_layouts.BUGS)


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(WRONG_ON))
def test_a_strided_bug_is_caught_within_50_cpu_examples_and_only_by_its_pool(bug: str) -> None:
    kernel = UserKernel(getattr(planted_layouts, bug), name=f"{planted_layouts.__name__}:{bug}")
    result = _campaign(kernel, 50)
    assert result.finding is not None, f"{bug} not caught in 50 examples"
    case = result.finding.case
    assert case.storage is not None and WRONG_ON[bug](case.storage), case.summary()
    assert check_case(kernel, case.replace(storage=None)).status == "pass"


@pytest.mark.slow
@pytest.mark.parametrize("name", planted_layouts.STRIDED_CORRECT)
def test_a_correct_strided_kernel_is_clean_over_40_cpu_examples(name: str) -> None:
    result = _campaign(UserKernel(getattr(planted_layouts, name), name=f"{planted_layouts.__name__}:{name}"), 40)
    assert result.finding is None and result.examples == 40, result.finding and result.finding.message


def test_sdpa_reads_any_strided_pool_through_its_views() -> None:
    plain = _case(None)
    expected = SdpaMath().run(plain, make_tensors(plain)).out
    for storage in STRIDED:
        case = _case(storage)
        assert torch.equal(SdpaMath().run(case, make_tensors(case)).out, expected), storage


# --- adapters: upstream takes the page stride from the tensor (FlashInfer's paged_kv_t, flash-attn's k_batch_stride) ---


def _paged_kv_t(paged_kv_cache, kv_layout: str):  # type: ignore[no-untyped-def]
    """What FlashInfer's run reads (``_unpack_paged_kv_cache``, then ``paged_kv_t``): K and V of equal strides, the
    page stride ``stride(0)``, the row and head strides by layout, the head dim contiguous (never its stride)."""
    k, v = paged_kv_cache.unbind(1) if isinstance(paged_kv_cache, torch.Tensor) else paged_kv_cache
    assert k.stride() == v.stride(), "k/v strides must be identical"
    assert k.stride(-1) == 1, "paged_kv_t reads the head dim as contiguous"
    return k, v


def _flashinfer_stand_in():  # type: ignore[no-untyped-def]
    from tests.fake_kernels import FakeDecodeWrapper

    class Wrapper(FakeDecodeWrapper):
        calls: list[dict] = []

        def __init__(self, workspace, kv_layout="NHD", use_tensor_cores=False, backend="auto"):
            self.kv_layout = kv_layout

        def run(self, q, paged_kv_cache, *, k_scale=None, v_scale=None, out=None, return_lse=False):
            k, v = _paged_kv_t(paged_kv_cache, self.kv_layout)
            Wrapper.calls.append({"page_stride": k.stride(0), "storage": k.untyped_storage().data_ptr()})
            k, v = (k.transpose(1, 2), v.transpose(1, 2)) if self.kv_layout == "HND" else (k, v)
            out = torch.empty(*q.shape[:2], v.shape[-1], dtype=q.dtype) if out is None else out
            return super().run(q, torch.stack((k, v), 1), k_scale=k_scale, v_scale=v_scale, out=out, return_lse=return_lse)

    return Wrapper


@pytest.mark.parametrize("storage", [Storage(page_padding=64), Storage("combined", "HND", layers=3, layer=1),
                                     Storage(kv_layout="HND", layers=2, layer=1, page_padding=448)], ids=lambda s: s.label())
def test_flashinfer_decode_takes_a_padded_or_cross_layer_pool_as_it_lies(storage: Storage, monkeypatch) -> None:
    from tests.fake_kernels import _module

    wrapper = _flashinfer_stand_in()
    monkeypatch.setitem(__import__("sys").modules, "flashinfer", _module("flashinfer", BatchDecodeWithPagedKVCacheWrapper=wrapper))
    backend = get_backend("flashinfer-decode")
    monkeypatch.setattr(type(backend), "device", property(lambda self: "cpu"))
    monkeypatch.setattr(backend, "capabilities", backend.capabilities.replace(storages=ALL_STORAGE_FEATURES[:-1]))  # upstream takes these two
    layout = Layout.from_lengths([1, 1], [40, 21], 16, page_order=[4, 0, 3, 1, 2, 5], extra_pages=1)
    case = Case(layout, Heads(4, 2, 64, 64), Options(q_dtype="float16", kv_dtype="float16"), seed=1, storage=storage)
    tensors = make_tensors(case)
    outcome = check_case(backend, case)
    assert outcome.status == "pass", outcome.message
    assert wrapper.calls[-1]["page_stride"] == tensors.k_cache.stride(0) != 16 * 2 * 64 * (2 if storage.kv == "combined" else 1)
    assert wrapper.calls[-1]["storage"] != 0 and tensors.k_cache.stride(0) == _page_stride_of(storage, case)


def _page_stride_of(storage: Storage, case: Case) -> int:
    page = case.layout.page_size * case.heads.num_kv_heads * case.heads.head_dim_qk
    return storage.layers * page * (2 if storage.kv == "combined" or storage.layers > 1 else 1) + storage.page_padding


def test_an_interleaved_head_dim_is_what_flashinfer_cannot_take() -> None:
    tensors = make_tensors(_case(Storage(dim_stride=2)))
    with pytest.raises(AssertionError, match="head dim as contiguous"):
        _paged_kv_t(tensors.paged_kv("NHD"), "NHD")
    for name in ("flashinfer-decode", "flashinfer-decode-tc", "flashinfer-prefill-fa2", "flashinfer-prefill-fa3",
                 "flash-attn-kvcache-paged", "sdpa-efficient"):
        assert not set(get_backend(name).capabilities.storages) & {"padded_pages", "cross_layer", "dim_stride"}, name
