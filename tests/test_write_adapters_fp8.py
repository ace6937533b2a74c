"""The library write adapters for fp8 caches (FlashInfer's byte-copying ``append_paged_kv_cache`` behind the
adapter's quantisation; SGLang's fused Triton write and its torch copy of ``set_kv_buffer``): registered,
declared as their sources allow, and judged on the CPU through fakes named as such (each doing what the
upstream source does, cited in its docstring) or through SGLang itself where it imports."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from pa_oracle.backends.writes import discover, get_write_kernel
from pa_oracle.backends.writes import sglang_fp8_set_kv as sglang_triton
from pa_oracle.backends.writes.flashinfer_append_fp8 import FlashInferAppendFP8
from pa_oracle.fuzz.checks.append import judge_write
from pa_oracle.fuzz.draw.appends import append_cases
from pa_oracle.oracle.append import FP8_CACHE_DTYPES, AppendCase

NEW = ("flashinfer-append-fp8", "sglang-fp8-set-kv", "sglang-fp8-set-kv-torch")
DRAWS = settings(max_examples=150, database=None, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))


def _drawn(name: str, count: int = 200) -> list[AppendCase]:
    cases: list[AppendCase] = []

    @settings(max_examples=count, database=None, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    @given(append_cases(get_write_kernel(name).capabilities))
    def take(case: AppendCase) -> None:
        cases.append(case)

    take()
    return cases


def test_the_fp8_adapters_are_registered_with_their_libraries() -> None:
    registry = discover()
    assert {name: registry[name].package for name in NEW} == {
        "flashinfer-append-fp8": "flashinfer", "sglang-fp8-set-kv": "sglang", "sglang-fp8-set-kv-torch": "sglang"}
    assert registry["flashinfer-append-fp8"].capabilities.devices == ("cuda",)
    assert registry["sglang-fp8-set-kv"].capabilities.devices == ("cuda",)
    assert "cpu" in registry["sglang-fp8-set-kv-torch"].capabilities.devices


@pytest.mark.parametrize("name, formats", [("flashinfer-append-fp8", set(FP8_CACHE_DTYPES)),
                                           ("sglang-fp8-set-kv", {"float8_e4m3fn"}),
                                           ("sglang-fp8-set-kv-torch", {"float8_e4m3fn"})])
def test_an_fp8_declaration_draws_scales_and_no_padding(name: str, formats: set[str]) -> None:
    cases = _drawn(name)
    assert {c.dtype for c in cases} == formats
    assert all(c.append_dtype is not None for c in cases)
    assert sum((c.k_scale, c.v_scale) != (1.0, 1.0) for c in cases) >= 100
    assert {c.append_dtype for c in cases} == {"bfloat16", "float16", "float32"}
    assert all(c.padding == 0 for c in cases)  # neither library skips slot -1 (module docstrings)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reason given on a machine without CUDA")
def test_without_cuda_or_the_library_they_say_why() -> None:
    assert get_write_kernel("flashinfer-append-fp8").unavailable_reason() == "needs CUDA"
    assert get_write_kernel("sglang-fp8-set-kv").unavailable_reason() == "needs CUDA"
    reason = get_write_kernel("sglang-fp8-set-kv-torch").unavailable_reason()
    if sglang_triton.sglang_import_error() is None:
        assert reason is None
    else:
        assert reason is not None and "sglang" in reason


# --- FlashInfer, through a FAKE of append_paged_kv_cache ---------------------------------------------------

def _fake_flashinfer(slot_shift: int = 0) -> types.ModuleType:
    """FAKE ``flashinfer`` (not the library): ``append_paged_kv_cache`` as 0.6.18.post1 does it. page.cu reads
    the appended rows as the *cache's* type through their element strides, unchecked (lines 94-106);
    page.cuh copies row i to page ``kv_indices[q]``, slot ``r`` of ``divmod(kv_indptr[b] * page_size +
    positions[i], page_size)`` (lines 409-418). ``slot_shift`` plants a placement bug."""

    def append_paged_kv_cache(append_key: torch.Tensor, append_value: torch.Tensor, batch_indices: torch.Tensor,
                              positions: torch.Tensor, paged_kv_cache: Any, kv_indices: torch.Tensor,
                              kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, kv_layout: str = "NHD") -> None:
        k_cache, v_cache = paged_kv_cache if isinstance(paged_kv_cache, tuple) else paged_kv_cache.unbind(1)
        page_size = k_cache.shape[1] if kv_layout == "NHD" else k_cache.shape[2]
        for cache, values in ((k_cache, append_key.contiguous()), (v_cache, append_value.contiguous())):
            as_cache_type = values.view(-1).view(torch.uint8).view(cache.dtype)
            rows = torch.as_strided(as_cache_type, values.shape, values.stride())
            for i in range(values.shape[0]):
                flat = int(kv_indptr[int(batch_indices[i])]) * page_size + int(positions[i]) + slot_shift
                page, slot = int(kv_indices[flat // page_size]), flat % page_size
                if kv_layout == "NHD":
                    cache[page, slot] = rows[i]
                else:
                    cache[page, :, slot] = rows[i]

    fake = types.ModuleType("flashinfer")
    setattr(fake, "append_paged_kv_cache", append_paged_kv_cache)
    return fake


class _Unquantised(FlashInferAppendFP8):
    """The adapter without its quantisation: the bf16/fp16/fp32 rows handed to the kernel as they are."""

    def append(self, case: AppendCase, inputs: Any) -> None:
        import flashinfer

        flashinfer.append_paged_kv_cache(inputs.append_k, inputs.append_v, inputs.batch_indices, inputs.positions,
                                         inputs.pool, inputs.kv_indices, inputs.kv_indptr, inputs.kv_last_page_len,
                                         kv_layout=case.kv_layout)


def test_flashinfer_fp8_adapter_is_clean_over_a_fake_of_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", _fake_flashinfer())
    kernel = FlashInferAppendFP8()
    seen: set[tuple[str, str, bool]] = set()

    @DRAWS
    @given(append_cases(kernel.capabilities.replace(head_dims=(64,))))
    def run(case: AppendCase) -> None:
        seen.add((case.dtype, case.kv_layout, case.combined))
        outcome = judge_write(case, kernel)
        assert outcome.ok, f"{case}: {outcome.detail}"

    run()
    assert len(seen) == 8, seen  # e4m3/e5m2 x NHD/HND x two tensors/one


@pytest.mark.parametrize("broken, what", [("slot", "the fake kernel writes one slot late"),
                                          ("unquantised", "the adapter hands bf16 rows to the byte copy")])
def test_the_fake_judge_is_not_vacuous(monkeypatch: pytest.MonkeyPatch, broken: str, what: str) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", _fake_flashinfer(slot_shift=int(broken == "slot")))
    kernel = _Unquantised() if broken == "unquantised" else FlashInferAppendFP8()
    case = AppendCase(seq_lens_before=(3, 0), append_lens=(4, 2), page_size=5, num_kv_heads=2, head_dim=64,
                      dtype="float8_e4m3fn", append_dtype="bfloat16", k_scale=0.5, v_scale=1.75)
    outcome = judge_write(case, kernel)
    assert outcome.status == "fail" and "appended slot" in outcome.detail, (what, outcome.detail)


# --- SGLang's Triton write, through a FAKE of fused_fp8_set_kv_buffer -------------------------------------

def _fake_fused_fp8_set_kv_buffer(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  cache_loc: torch.Tensor, k_scale: float | None = None, v_scale: float | None = None,
                                  page_size: int = 16, use_triton: bool = True) -> None:
    """FAKE (not SGLang): its Triton path as trtllm_fp8_kv_kernel.py 0.5.10.post1 has it. ``tl.arange(0,
    min(heads, 8))`` compiles for a power of two only (lines 54, 340); each value times the float32 reciprocal
    of its scale (line 370), rounded to e4m3 (line 72), stored at page ``loc // page_size``, slot
    ``loc % page_size`` of a 4-D cache or row ``loc`` of a 3-D one (lines 144-145, 296-324)."""
    block = min(k_cache.shape[-2], 8)
    if block & (block - 1):
        raise ValueError(f"arange's range must be a power of 2 (BLOCK_HEAD={block})")
    assert cache_loc.dtype == torch.int32 and k_scale is not None and v_scale is not None
    loc = cache_loc.long()
    for cache, values, scale in ((k_cache, k, k_scale), (v_cache, v, v_scale)):
        inverse = 1.0 / torch.tensor(scale, dtype=torch.float32)
        quantised = (values.float() * inverse).to(torch.float8_e4m3fn)
        if cache.ndim == 3:
            cache[loc] = quantised
        else:
            cache[loc // page_size, loc % page_size] = quantised


@pytest.fixture
def fake_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType(sglang_triton.MODULE)
    setattr(fake, sglang_triton.FUNCTION, _fake_fused_fp8_set_kv_buffer)
    monkeypatch.setitem(sys.modules, sglang_triton.MODULE, fake)


def test_head_groups_are_powers_of_two() -> None:
    sizes = {n: [g.stop - g.start for g in sglang_triton.head_groups(n)] for n in range(1, 13)}
    assert sizes == {1: [1], 2: [2], 3: [2, 1], 4: [4], 5: [4, 1], 6: [4, 2], 7: [4, 2, 1], 8: [8], 9: [9], 10: [10],
                     11: [11], 12: [12]}


def test_sglang_triton_adapter_is_clean_over_a_fake_of_the_kernel(fake_sglang: None) -> None:
    kernel = get_write_kernel("sglang-fp8-set-kv")
    heads: set[int] = set()

    @DRAWS
    @given(append_cases(kernel.capabilities.replace(head_dims=(64,))))
    def run(case: AppendCase) -> None:
        heads.add(case.num_kv_heads)
        outcome = judge_write(case, kernel)
        assert outcome.ok, f"{case}: {outcome.detail}"

    run()
    assert 3 in heads, heads


def test_sglang_triton_kernel_needs_the_head_groups(fake_sglang: None, monkeypatch: pytest.MonkeyPatch) -> None:
    case = AppendCase(seq_lens_before=(2,), append_lens=(3,), page_size=5, num_kv_heads=3, head_dim=64,
                      dtype="float8_e4m3fn", append_dtype="bfloat16", k_scale=0.5, v_scale=2.0)
    kernel = get_write_kernel("sglang-fp8-set-kv")
    assert judge_write(case, kernel).ok
    monkeypatch.setattr(sglang_triton, "head_groups", lambda n: [slice(0, n)])
    outcome = judge_write(case, kernel)
    assert outcome.status == "crash" and "power of 2" in outcome.detail, outcome.detail


# --- SGLang's torch copy of set_kv_buffer, the library itself (where it imports) -------------------------

def _needs_sglang() -> None:
    if reason := sglang_triton.sglang_import_error():
        pytest.skip(f"sglang-fp8-set-kv-torch: {reason}")


def test_sglang_torch_write_is_clean_over_the_drawn_cases() -> None:
    _needs_sglang()
    kernel = get_write_kernel("sglang-fp8-set-kv-torch")

    @DRAWS
    @given(append_cases(kernel.capabilities))
    def run(case: AppendCase) -> None:
        outcome = judge_write(case, kernel)
        assert outcome.ok, f"{case}: {outcome.detail}"

    run()


@pytest.mark.parametrize("append_dtype, differs", [("bfloat16", True), ("float16", True), ("float32", False)])
def test_sglang_torch_write_rounds_twice_with_a_calibrated_scale(append_dtype: str, differs: bool) -> None:
    _needs_sglang()
    case = AppendCase(seq_lens_before=(3, 0), append_lens=(20, 9), page_size=5, num_kv_heads=4, head_dim=64,
                      dtype="float8_e4m3fn", append_dtype=append_dtype, k_scale=0.3, v_scale=0.3)
    outcome = judge_write(case, get_write_kernel("sglang-fp8-set-kv-torch"))
    assert (outcome.status == "fail") == differs, outcome.detail
    if differs:
        assert "appended slot" in outcome.detail and outcome.verdict is not None and outcome.verdict.count > 20


# --- the libraries on a GPU ----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name", NEW)
def test_real_library_fp8_writes(name: str) -> None:
    kernel = get_write_kernel(name)
    if reason := kernel.unavailable_reason():
        pytest.skip(f"{name}: {reason}")
    if kernel.device != "cuda":
        pytest.skip(f"{name}: no CUDA here (its CPU run is tested above)")

    @settings(max_examples=60, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(append_cases(kernel.capabilities))
    def run(case: AppendCase) -> None:
        outcome = judge_write(case, kernel)
        assert outcome.ok, f"{case}: {outcome.detail}"

    run()
