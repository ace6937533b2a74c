from __future__ import annotations

from pathlib import Path

import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from pa_oracle.backends import get_backend
from pa_oracle.backends.flashinfer_mask import documented_packed_mask, element_mask_indptr, flat_mask
from pa_oracle.fuzz.campaign.variants import plan_variants
from pa_oracle.fuzz.draw.strategies import Limits, cases, variant_keys
from pa_oracle.oracle.case import Case, flashinfer_packed_mask

from tests.fake_kernels import _module

RNG = np.random.default_rng(14)
MASKS = [RNG.random((3, 7)) < 0.5, RNG.random((2, 5)) < 0.5, RNG.random((4, 4)) < 0.5]  # 21, 10, 16 bits


def _packbits_little(bits: list[bool]) -> list[int]:
    """numpy-free packbits(bitorder="little"): bit t is bit t % 8 of byte t // 8, zero padding."""
    return [sum(int(b) << j for j, b in enumerate(bits[i : i + 8])) for i in range(0, len(bits), 8)]


def _kernel_bit(packed: np.ndarray, mask_indptr: np.ndarray, b: int, q: int, k: int, kv_len: int) -> int | None:
    """What FlashInfer's LogitsMask reads (variants.cuh): ``custom_mask + mask_indptr[b]`` as a byte
    pointer, bit ``q * kv_len + k`` from there; None past the buffer."""
    offset = q * kv_len + k
    byte = int(mask_indptr[b]) + offset // 8
    return None if byte >= len(packed) else (int(packed[byte]) >> (offset % 8)) & 1


def test_custom_mask_is_the_documented_flat_layout() -> None:
    expected = [bool(x) for m in MASKS for row in m for x in row]  # request by request, row-major
    assert flat_mask(MASKS).tolist() == expected


def test_the_packed_custom_mask_is_packbits_of_the_whole_flat_mask() -> None:
    flat = [bool(x) for m in MASKS for row in m for x in row]
    assert documented_packed_mask(MASKS).tolist() == _packbits_little(flat)
    assert element_mask_indptr(MASKS).tolist() == [0, 21, 31, 47]  # cumsum(qo_len * kv_len)


def test_the_user_kernel_form_is_segment_packbits_with_byte_offsets() -> None:
    packed, indptr = flashinfer_packed_mask(MASKS)
    segments = [_packbits_little([bool(x) for row in m for x in row]) for m in MASKS]
    assert packed.tolist() == [byte for seg in segments for byte in seg]
    assert indptr.tolist() == [0, 3, 5, 7]  # ceil(21/8), ceil(10/8), ceil(16/8) bytes


def test_the_kernel_reads_segment_packing_right_and_the_documented_packing_wrong_past_request_0() -> None:
    packed, byte_indptr = flashinfer_packed_mask(MASKS)
    for b, m in enumerate(MASKS):  # what plan(custom_mask=...) hands the kernel: every bit where it belongs
        assert [[_kernel_bit(packed, byte_indptr, b, q, k, m.shape[1]) for k in range(m.shape[1])]
                for q in range(m.shape[0])] == m.astype(int).tolist()
    documented, elements = documented_packed_mask(MASKS), element_mask_indptr(MASKS)
    read = [[[_kernel_bit(documented, elements, b, q, k, m.shape[1]) for k in range(m.shape[1])]
             for q in range(m.shape[0])] for b, m in enumerate(MASKS)]
    assert read[0] == MASKS[0].astype(int).tolist()  # request 0 starts at offset 0 either way
    assert all(bit is None for row in read[1] + read[2] for bit in row)  # 21 and 31 "bytes" in: past the 6-byte buffer


# --- MLA compile keys -----------------------------------------------------------------------


@pytest.mark.parametrize("name, suffix", [("flashinfer-mla", ""), ("flashinfer-mla-fa3", "_sm90")])
def test_mla_modules_are_named_as_flashinfer_names_them(name: str, suffix: str) -> None:
    backend = get_backend(name)
    key = (("q_dtype", "bfloat16"), ("kv_dtype", "float8_e4m3fn"))
    assert backend.mla_uri(key) == (  # get_batch_mla_uri(backend, bf16, e4m3, bf16, int32, 512, 64, False)
        "batch_mla_attention_dtype_q_bf16_dtype_kv_e4m3_dtype_o_bf16_dtype_idx_i32_head_dim_ckv_512_head_dim_kpe_64_"
        "profiler_False" + suffix
    )
    refused = (("q_dtype", "float16"), ("kv_dtype", "float8_e4m3fn"))
    assert backend.built_reason(refused).startswith("refused")


def _drawn(backend, keys, count: int = 12) -> list[Case]:  # type: ignore[no-untyped-def]
    found: list[Case] = []
    caps = backend.capabilities.replace(devices=("cpu",))

    @seed(3)
    @settings(max_examples=count, database=None, deadline=None, phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(cases(caps, Limits(max_kv_len=32, max_qo_heads=4), variants=keys))
    def take(case: Case) -> None:
        found.append(case)

    take()
    return found


def test_mla_cases_drawn_inside_a_key_run_on_that_key() -> None:
    backend = get_backend("flashinfer-mla-fa3")
    keys = variant_keys(backend.capabilities, Limits(), backend.compile_fields)
    assert len(keys) == 4  # q f16/bf16, kv q's own or e4m3
    for key in keys:
        drawn = _drawn(backend, [key])
        assert {backend.compile_key(c) for c in drawn} == {key}
        assert all(c.heads.mla and (c.heads.head_dim_qk, c.heads.head_dim_vo) == (576, 512) for c in drawn)


def test_mla_variants_are_planned_and_built_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = get_backend("flashinfer-mla-fa3")
    built: set[str] = set()
    monkeypatch.setattr("pa_oracle.backends.flashinfer_mla.built_module", lambda uri: "cached" if uri in built else None)
    plan = plan_variants(backend, Limits(), budget=2 * backend.compile_seconds, seed=0)
    assert plan is not None and plan.space == 3 and len(plan.chosen) == 2 and not plan.free  # f16 q + e4m3: left out
    assert plan_variants(backend, Limits(), budget=1.0, seed=0).chosen  # a small budget still runs one key
    calls: list[tuple] = []

    class Spec:  # a JitSpec: built by its own build() (its ninja log where build_and_load looks), never build_jit_specs
        aot_path = Path("/nonexistent/aot.so")

        def __init__(self, *args):  # type: ignore[no-untyped-def]
            self.args = args

        def build(self, need_lock: bool = False) -> None:
            calls.append(self.args)
            backend_name, q, kv, o, idx, ckv, kpe, profiler = self.args
            key = (("q_dtype", str(q).removeprefix("torch.")), ("kv_dtype", str(kv).removeprefix("torch.")))
            built.add(backend.mla_uri(key))

    monkeypatch.setitem(sys.modules, "flashinfer.jit", _module("flashinfer.jit", gen_batch_mla_module=Spec))
    assert backend.build_variants(plan.chosen) == plan.chosen
    assert all(args[0] == "fa3" and args[3] == args[1] and args[4] is torch.int32 and args[5:] == (512, 64, False) for args in calls)
    again = plan_variants(backend, Limits(), budget=0, seed=0)
    assert again is not None and set(plan.chosen) <= set(again.free)  # a later campaign finds them built


def test_flashinfer_modules_are_built_each_by_its_own_ninja_side_by_side(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # build_jit_specs' one ninja run logs in the JIT folder, and a later build_and_load recompiles: each
    # JitSpec builds itself (its log where build_and_load looks), the MAX_JOBS shared, prebuilt ones skipped
    import os
    import threading

    from pa_oracle.backends.flashinfer import build_modules

    seen: list[tuple[str, str | None]] = []
    barriers = {"a": threading.Barrier(3, timeout=10), "alone": threading.Barrier(1)}  # the three are built at once

    class Spec:
        def __init__(self, name: str, prebuilt: bool) -> None:
            self.name, self.aot_path = name, tmp_path / (f"{name}.so" if prebuilt else "missing.so")
            if prebuilt:
                self.aot_path.touch()

        def build(self, need_lock: bool = False) -> None:
            assert need_lock, "another process may build the same module"
            seen.append((self.name, os.environ.get("MAX_JOBS")))
            barriers.get(self.name, barriers["a"]).wait()

    monkeypatch.setenv("MAX_JOBS", "16")
    build_modules([Spec("a", False), Spec("aot", True), Spec("b", False), Spec("c", False)])
    assert sorted(seen) == [("a", "5"), ("b", "5"), ("c", "5")]
    assert os.environ["MAX_JOBS"] == "16"
    monkeypatch.delenv("MAX_JOBS")
    seen.clear()
    build_modules([Spec("alone", False)])
    assert seen == [("alone", None)] and "MAX_JOBS" not in os.environ


def test_flashinfer_module_builds_never_run_more_at_once_than_max_jobs_and_each_failure_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    # 12 modules under MAX_JOBS=4 are 4 ninjas at a time of one job each (12 side by side would be
    # 12 nvcc processes of GBs each); a failed build does not hide another's
    import threading
    import time

    from pa_oracle.backends.flashinfer import build_modules

    lock, live, peak = threading.Lock(), [0], [0]

    class Spec:
        def __init__(self, name: str) -> None:
            self.name, self.aot_path = name, tmp_path / "missing.so"

        def build(self, need_lock: bool = False) -> None:
            with lock:
                live[0] += 1
                peak[0] = max(peak[0], live[0])
            time.sleep(0.05)
            with lock:
                live[0] -= 1
            if self.name in ("m3", "m7"):
                raise RuntimeError(f"Ninja build failed: {self.name}")

    monkeypatch.setenv("MAX_JOBS", "4")
    with pytest.raises(RuntimeError, match=r"2 of 12 FlashInfer module builds failed \(m3, m7\)"):
        build_modules([Spec(f"m{i}") for i in range(12)])
    assert peak[0] == 4
