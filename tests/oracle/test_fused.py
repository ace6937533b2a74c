from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pa_oracle.backends.base import Capabilities
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.oracle.case import KV_DTYPES, Case, CaseError, Heads, Layout, Options, alibi_slopes
from pa_oracle.oracle.fused import DEFAULT_CONFIG, STATIC_NAMES, FusedConfig
from pa_oracle.oracle.reference import Reference, reference
from pa_oracle.oracle.tensors import Tensors, make_tensors

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parents[2]


def _interpreting() -> bool:
    if not HAS_TRITON:
        return False
    from pa_oracle.oracle._fused_kernel import interpreting

    return interpreting()


# Triton's interpreter is chosen per process, when triton is first imported (TRITON_INTERPRET=1):
# the interpreted tests run here only in such a process; otherwise one test reruns them in one.
INTERPRETING = _interpreting()
interpreted = pytest.mark.skipif(
    not INTERPRETING,
    reason="needs triton imported under TRITON_INTERPRET=1 (test_interpreted_tests_in_a_subprocess runs them)" if HAS_TRITON else "needs triton (pip install triton)",
)
needs_cuda = pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA) or INTERPRETING, reason="needs triton, compiled (TRITON_INTERPRET unset), and a CUDA device")

ALL_OPTIONS = Capabilities(kv_dtypes=KV_DTYPES)
# the interpreter runs every program in Python: a few tiny cases only
TINY = Limits(max_batch=3, max_kv_len=24, max_qo_len=6, max_extra_pages=2, max_kv_heads=2, max_qo_heads=8, head_dims=(16, 8, 80))
RELATIVE = 1e-12  # float64 rounding of two different summation orders, far below any kernel's error


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton (pip install triton)")
@pytest.mark.skipif(INTERPRETING, reason="this process already runs the interpreted tests")
def test_interpreted_tests_in_a_subprocess() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "interpreted and not subprocess", str(Path(__file__).resolve())]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and " passed" in result.stdout and "skipped" not in result.stdout, (
        f"TRITON_INTERPRET=1 {' '.join(command)}\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    )


def _interpreted(case: Case, tensors: Tensors, lse_base: str = "e", logit_noise: bool = False, config: str = "default") -> Reference:
    from pa_oracle.oracle.fused import fused_attention

    return fused_attention(case, tensors, lse_base=lse_base, logit_noise=logit_noise, config=_config(config))


def _config(name: str) -> FusedConfig:
    """A named config: "default", or e.g. "128x32w8-split512-s2-noside" (block_m x block_n, warps,
    optional split_keys, num_stages, and no side stream)."""
    if name == "default":
        return DEFAULT_CONFIG
    tiles, *rest = name.split("-")
    block_m, block_n_warps = tiles.split("x")
    block_n, warps = block_n_warps.split("w")
    fields = {"block_m": int(block_m), "block_n": int(block_n), "num_warps": int(warps), "split_keys": 0}
    for part in rest:
        if part.startswith("split"):
            fields["split_keys"] = int(part.removeprefix("split"))
        elif part.startswith("s"):
            fields["num_stages"] = int(part.removeprefix("s"))
        elif part == "noside":
            fields["side_stream"] = False
        else:
            raise ValueError(f"unknown config part {part!r} in {name!r}")
    return FusedConfig(**fields)


def _assert_matches(fused: Reference, ref: Reference, case: Case) -> None:
    __tracebackhide__ = True
    assert fused.out.dtype == fused.lse.dtype == torch.float64
    assert (fused.logit_noise is None) == (ref.logit_noise is None), "logit_noise returned iff asked for"
    assert fused.out.shape == ref.out.shape and fused.lse.shape == ref.lse.shape
    fused_out, fused_lse, ref_out, ref_lse = (t.cpu() for t in (fused.out, fused.lse, ref.out, ref.lse))
    assert torch.equal(torch.isneginf(fused_lse), torch.isneginf(ref_lse)), f"rows with no key differ [{case.summary()}]"
    assert torch.isfinite(fused_out).all(), f"non-finite output (a poisoned slot read?) [{case.summary()}]"
    empty = torch.isneginf(ref_lse)
    assert torch.equal(fused_out[empty], torch.zeros_like(fused_out[empty])), "rows with no key must give out 0"
    out_err = (fused_out - ref_out).abs().max().item() if ref_out.numel() else 0.0
    out_scale = max(1.0, ref_out.abs().max().item() if ref_out.numel() else 0.0)
    assert out_err <= RELATIVE * out_scale, f"out: max |fused - reference| {out_err:.3g} > {RELATIVE:g} x {out_scale:.3g} [{case.summary()}]"
    finite = ~empty
    if finite.any():
        lse_err = (fused_lse[finite] - ref_lse[finite]).abs().max().item()
        lse_scale = max(1.0, ref_lse[finite].abs().max().item())
        assert lse_err <= RELATIVE * lse_scale, f"lse: max |fused - reference| {lse_err:.3g} > {RELATIVE:g} x {lse_scale:.3g} [{case.summary()}]"
    if ref.logit_noise is not None and ref.logit_noise.numel() and case.distribution != "exact":
        # not on "exact" data: its q.k often cancel to 0 exactly, where half_ulp jumps (0 counts as
        # [0.5, 1)), and the residue of rounding q * sm_scale, which depends on the summation order,
        # decides between 2^-25 and ~2^-80 (seen: 0.67 relative on a 5-key case)
        assert fused.logit_noise is not None
        fused_noise, ref_noise = fused.logit_noise.cpu(), ref.logit_noise.cpu()
        assert torch.equal(fused_noise[empty], torch.zeros_like(fused_noise[empty])), "rows with no key must give logit noise 0"
        noise_err = (fused_noise - ref_noise).abs().max().item()
        noise_scale = ref_noise.abs().max().item()
        assert noise_err <= RELATIVE * noise_scale, f"logit_noise: max |fused - reference| {noise_err:.3g} > {RELATIVE:g} x {noise_scale:.3g} [{case.summary()}]"


@interpreted
@settings(max_examples=8, deadline=None)
@given(case=cases(ALL_OPTIONS, TINY), lse_base=st.sampled_from(["e", "2"]), logit_noise=st.booleans(), config=st.sampled_from(["default", "64x16w4-split16"]))
def test_interpreted_kernel_matches_reference(case: Case, lse_base: str, logit_noise: bool, config: str) -> None:
    tensors = make_tensors(case)
    expected = reference(case, tensors, lse_base=lse_base, logit_noise=logit_noise, engine="torch")
    _assert_matches(_interpreted(case, tensors, lse_base, logit_noise, config), expected, case)


# every feature at once over a ragged batch: an empty request, kv_len 0 with queries, qo_len > kv_len,
# a shuffled page table with unused (NaN) pages, partial last pages
_RAGGED = Layout.from_lengths([1, 3, 0, 5, 2, 4], [7, 2, 4, 21, 0, 9], page_size=4, page_order=[3, 1, 0, 7, 2, 14, 6, 12, 4, 5, 8, 9, 11, 10, 13], extra_pages=2)
_SINKS = (0.0, 1.0, -2.0, 4.0, 0.0, 1.0, 4.0, -2.0)


@interpreted
@pytest.mark.parametrize(
    ("heads", "options", "lse_base"),
    [
        (Heads(8, 2, 80, 80), Options(causal=True, window_left=3, logits_soft_cap=5.0, alibi_slopes=alibi_slopes(8), sinks=_SINKS, q_dtype="bfloat16", kv_dtype="float8_e4m3fn", k_scale=0.75, v_scale=0.5), "e"),
        (Heads(8, 1, 64, 16), Options(causal=False, sm_scale=0.3, q_dtype="float16", kv_dtype="float8_e5m2", k_scale=2.0), "2"),
        (Heads(3, 3, 128, 128), Options(causal=True, window_left=0, logits_soft_cap=30.0, q_dtype="float32", kv_dtype="float32"), "e"),
    ],
    ids=["gqa4-all-options-fp8e4m3-dim80", "gqa8-noncausal-fp8e5m2-dims64x16-base2", "mha-window0-dim128"],
)
@pytest.mark.parametrize("config", ["default", "64x16w4-split16"])
def test_interpreted_kernel_matches_reference_on_a_ragged_batch(heads: Heads, options: Options, lse_base: str, config: str) -> None:
    case = Case(_RAGGED, heads, options, seed=3, distribution="outliers")
    tensors = make_tensors(case)
    expected = reference(case, tensors, lse_base=lse_base, logit_noise=True, engine="torch")
    _assert_matches(_interpreted(case, tensors, lse_base, logit_noise=True, config=config), expected, case)


@interpreted
def test_interpreted_split_contexts_change_only_rounding_and_a_lone_chunk_nothing() -> None:
    # request 0 spans 3 chunks of 16 keys, request 1 one chunk: its partial state goes through the
    # merge kernel alone, which must give exactly the unsplit result
    case = Case(Layout.from_lengths([1, 1, 2], [40, 5, 9], page_size=4), Heads(4, 2, 16, 16), Options(causal=True, sinks=(1.0, 0.0, -1.0, 2.0)), seed=4)
    tensors = make_tensors(case)
    split, whole = (_interpreted(case, tensors, logit_noise=True, config=c) for c in ("64x16w4-split16", "64x16w4"))
    alone = slice(1, 4)
    for name, a, b in (("out", split.out, whole.out), ("lse", split.lse, whole.lse), ("logit_noise", split.logit_noise, whole.logit_noise)):
        assert a is not None and b is not None
        assert torch.equal(a[alone], b[alone]), f"{name}: a one-chunk request differs after the merge"
        assert torch.allclose(a[0], b[0], rtol=RELATIVE, atol=0.0), f"{name}: the split request differs beyond rounding"
    assert not torch.equal(split.out[0], whole.out[0]) or not torch.equal(split.lse[0], whole.lse[0]), "request 0 was not split"
    _assert_matches(split, reference(case, tensors, logit_noise=True, engine="torch"), case)


@interpreted
@pytest.mark.parametrize("config", ["default", "64x16w4-split16"])
def test_interpreted_request_order_changes_nothing_but_row_order(config: str) -> None:
    qo, kv, order = [3, 1, 5], [9, 17, 6], [2, 0, 1]
    case = Case(Layout.from_lengths(qo, kv, page_size=4), Heads(4, 2, 16, 16), Options(causal=True, window_left=5), seed=5)
    moved = case.replace(layout=Layout.from_lengths([qo[b] for b in order], [kv[b] for b in order], page_size=4, page_order=list(range(10))[::-1]))
    tensors = make_tensors(case)
    q_rows = [torch.arange(case.layout.qo_indptr[b], case.layout.qo_indptr[b + 1]) for b in order]
    k_rows = [torch.arange(sum(kv[:b]), sum(kv[: b + 1])) for b in order]
    moved_tensors = _with_logical_order(moved, tensors.q[torch.cat(q_rows)], *(_logical(case, c)[torch.cat(k_rows)] for c in (tensors.k_cache, tensors.v_cache)))
    a, b = _interpreted(case, tensors, config=config), _interpreted(moved, moved_tensors, config=config)
    assert torch.equal(a.out[torch.cat(q_rows)], b.out) and torch.equal(a.lse[torch.cat(q_rows)], b.lse)


def _logical(case: Case, cache: torch.Tensor) -> torch.Tensor:
    from pa_oracle.oracle.tensors import token_addresses

    pages, slots = token_addresses(case)
    return cache[pages, slots]


def _with_logical_order(case: Case, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> Tensors:
    from pa_oracle.oracle.tensors import token_addresses

    lay, heads = case.layout, case.heads
    pools = []
    for x in (keys, values):
        pool = torch.full((lay.num_pages, lay.page_size, heads.num_kv_heads, x.shape[-1]), float("nan"), dtype=x.dtype)
        pages, slots = token_addresses(case)
        pool[pages, slots] = x
        pools.append(pool)
    return Tensors(q, *pools)


@interpreted
def test_interpreted_refusals_and_fallbacks() -> None:
    from pa_oracle.oracle.fused import fused_attention, fused_reference

    case = Case(Layout.from_lengths([1], [3], page_size=2), Heads(1, 1, 512, 512))
    tensors = make_tensors(case)
    assert fused_reference(case, tensors) is None
    with pytest.raises(CaseError, match="head dim 512"):
        fused_attention(case, tensors)
    small = Case(Layout.from_lengths([1], [3], page_size=2), Heads(1, 1, 8, 8))
    assert fused_reference(small, make_tensors(small)) is None  # CPU tensors, even under the interpreter
    with pytest.raises(ValueError, match="lse_base"):
        fused_reference(small, make_tensors(small), lse_base="10")


def test_cpu_tensors_fall_back_to_the_caller() -> None:
    from pa_oracle.oracle.fused import fused_reference

    case = Case(Layout.from_lengths([1], [3], page_size=2), Heads(1, 1, 8, 8))
    assert fused_reference(case, make_tensors(case)) is None


def test_config_rejects_tiles_tl_dot_cannot_take() -> None:
    with pytest.raises(ValueError, match="block_n"):
        FusedConfig(block_n=8)
    with pytest.raises(ValueError, match="block_m"):
        FusedConfig(block_m=96)
    with pytest.raises(ValueError, match="split_keys"):
        FusedConfig(block_n=64, split_keys=96)
    with pytest.raises(ValueError, match="max_registers"):
        FusedConfig(max_registers=256)
    with pytest.raises(ValueError, match="static_options takes .*got group_size"):
        FusedConfig(static_options=("causal", "group_size"))


@interpreted
def test_interpreted_static_options_change_no_bit() -> None:
    # every option compiled in (the constexpr kernel of old) against every option a runtime value
    case = Case(_RAGGED, Heads(8, 2, 80, 80), Options(causal=True, window_left=3, logits_soft_cap=5.0, alibi_slopes=alibi_slopes(8), sinks=_SINKS), seed=6)
    tensors = make_tensors(case)
    from pa_oracle.oracle.fused import fused_attention

    runtime = _config("64x16w4-split16")
    static = dataclasses.replace(runtime, static_options=STATIC_NAMES)
    for noise in (True, False):
        a, b = (fused_attention(case, tensors, logit_noise=noise, config=c) for c in (runtime, static))
        assert torch.equal(a.out, b.out) and torch.equal(a.lse, b.lse)
        assert (a.logit_noise is None) == (not noise) and (not noise or torch.equal(a.logit_noise, b.logit_noise))


# a spread of cases of one head dim and dtype: every group size 1..8, kv heads 1-2, page sizes 1, 5
# and 16, and each of the 64 combinations of the six options a call can switch
def _spread(head_dim: int = 64) -> list[tuple[Case, bool]]:
    drawn = []
    for i, bits in enumerate(itertools.product((False, True), repeat=6)):
        causal, window, cap, alibi, sinks, noise = bits
        group, kv_heads, page = (1, 2, 3, 4, 8)[i % 5], 1 + i % 2, (1, 5, 16)[i % 3]
        heads = Heads(group * kv_heads, kv_heads, head_dim, head_dim)
        options = Options(
            causal=causal, window_left=4 if window else -1, logits_soft_cap=30.0 if cap else 0.0,
            alibi_slopes=alibi_slopes(heads.num_qo_heads) if alibi else None, sinks=(0.5,) * heads.num_qo_heads if sinks else None,
            q_dtype="bfloat16", kv_dtype="bfloat16",
        )  # fmt: skip
        drawn.append((Case(Layout.from_lengths([1, 1, 5, 3], [40, 7, 30, 2], page_size=page), heads, options, seed=i), noise))
    return drawn


def _by_tile_shape(keys: set[tuple]) -> dict[tuple, set[tuple]]:
    """Compile keys grouped by what may tell kernels apart: the kernel, its tile (BLOCK_M, BLOCK_N,
    the padded head dims), loop kind and launch options; every other part of a key must be one
    value per group, or a case's group size, page size or option costs a compile."""
    shaping = {"BLOCK_M", "BLOCK_N", "BLOCK_DQK", "BLOCK_DVO", "PIPELINE"}
    groups: dict[tuple, set[tuple]] = {}
    for name, spec, options in keys:
        shape = tuple(entry for entry in spec if entry[0] in shaping)
        groups.setdefault((name, shape, options), set()).add(spec)
    return groups


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton (pip install triton)")
def test_group_sizes_page_sizes_and_options_share_one_compiled_kernel_per_tile_shape() -> None:
    from pa_oracle.oracle import _fused_kernel as fk
    from pa_oracle.oracle.fused import _FLAG_BITS, compile_keys

    assert _FLAG_BITS == fk.FLAG_BITS, "fused.py and the kernel disagree on the option bits"
    runtime = dataclasses.replace(DEFAULT_CONFIG, static_options=())
    configs = (runtime, dataclasses.replace(_config("64x16w4-split16"), static_options=()))
    keys = {key for case, noise in _spread() for config in configs for key in compile_keys(case, make_tensors(case), logit_noise=noise, config=config)}
    groups = _by_tile_shape(keys)
    varying = {group: specs for group, specs in groups.items() if len(specs) > 1}
    assert not varying, f"{len(keys)} compile keys for {len(groups)} tile shapes; one shape's keys: {sorted(next(iter(varying.values())))[:2]}"
    assert {name for name, _, _ in groups} == {"_attention", "_merge"} and len(groups) >= 6, "the spread must reach small, big and split tiles"
    # the default compiles in what the H200 measured at >= 10% (group, logit_noise, partial): the keys of a
    # tile shape grow with those values only (5 group sizes x noise x partial), not with the other options
    default = {key for case, noise in _spread() for key in compile_keys(case, make_tensors(case), logit_noise=noise, config=DEFAULT_CONFIG)}
    assert max(len(specs) for specs in _by_tile_shape(default).values()) <= 5 * 2 * 2
    # the check can fail: the same spread with the group size and causal mask compiled in does
    static = dataclasses.replace(configs[1], static_options=("group", "causal"))
    compiled_in = {key for case, noise in _spread() for key in compile_keys(case, make_tensors(case), logit_noise=noise, config=static)}
    assert any(len(specs) >= 10 for specs in _by_tile_shape(compiled_in).values())
    # so can the int rule: a group size of 1 specializes unless do_not_specialize names it
    fn, names = fk.RAW["attention"], list(inspect.signature(fk.RAW["attention"]).parameters)
    for skip, same in ((fk.DO_NOT_SPECIALIZE["attention"], True), (set(fk.DO_NOT_SPECIALIZE["attention"]) - {"group"}, False)):
        one, four = (fk.specialization_key(fn, skip, [g if name == "group" else 16 for name in names], {}) for g in (1, 4))
        assert (one == four) == same


def test_split_chunks_cover_exactly_the_blocks_a_tile_attends() -> None:
    from pa_oracle.oracle.fused import _chunks

    # table rows: q_start, qo_len, kv_len, first page entry, first packed row, key begin, key end
    table = np.array([[0, 1, 1000, 0, 0, 0, 1000], [1, 1, 256, 0, 0, 0, 256], [2, 4, 300, 0, 0, 0, 300], [6, 1, 0, 0, 0, 0, 0]])
    decode = Case(Layout.from_lengths([1, 1, 4, 1], [1000, 256, 300, 0], page_size=16), Heads(8, 2, 16, 16), Options(causal=True))
    chunks = _chunks(table, 16, 4, decode, 256)
    assert chunks is not None
    begins, counts = chunks
    assert counts.tolist() == [4, 1, 2, 1] and begins.tolist() == [0, 256, 512, 768, 0, 0, 256, 0]
    # a window of 300 keys: request 0 (at 999) sees keys 699.., request 2's first query (at 296) keys 0..
    windowed = _chunks(table, 16, 4, decode.replace(options=Options(causal=True, window_left=300)), 256)
    assert windowed is not None and windowed[1].tolist() == [2, 1, 2, 1] and windowed[0].tolist() == [512, 768, 0, 0, 256, 0]
    narrow = decode.replace(options=Options(causal=True, window_left=40))
    assert _chunks(table, 16, 4, narrow, 256) is None, "every window fits one chunk: no split"
    assert _chunks(table, 16, 4, decode, 1024) is None, "no tile spans two chunks: no split"
    assert _chunks(table, 16, 4, decode, 0) is None, "split_keys 0 is off"


@needs_cuda
@pytest.mark.gpu
@settings(max_examples=60, deadline=None)
@given(
    case=cases(ALL_OPTIONS, Limits(max_batch=6, max_kv_len=300, max_qo_len=200)),
    lse_base=st.sampled_from(["e", "2"]),
    logit_noise=st.booleans(),
    config=st.sampled_from(["default", "128x64w8-split64", "128x32w8-split128-s2"]),
)
def test_cuda_kernel_matches_reference(case: Case, lse_base: str, logit_noise: bool, config: str) -> None:
    from pa_oracle.oracle.fused import fused_reference

    tensors = make_tensors(case, "cuda")
    fused = fused_reference(case, tensors, lse_base=lse_base, logit_noise=logit_noise, config=_config(config))
    if fused is None:  # only e4m3 below sm_89 or a head dim > 256, neither drawn on an H200
        pytest.skip("fused_reference declined the case")
    _assert_matches(fused, reference(case, tensors, lse_base=lse_base, logit_noise=logit_noise, engine="torch"), case)


def _serving_like_case() -> Case:
    qo, kv = [1] * 6 + [37, 130, 3], [700, 1, 33, 0, 129, 2048, 300, 1100, 1500]
    layout = Layout.from_lengths(qo, kv, page_size=16, page_order=list(range(sum(-(-n // 16) for n in kv)))[::-1])
    return Case(layout, Heads(32, 8, 128, 128), Options(causal=True, q_dtype="bfloat16", kv_dtype="bfloat16"), seed=7)


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize(
    "config", ["default", "128x32w8", "128x64w8-split256-noside", "128x64w8-split128-s2", "64x64w8-split512", "16x16w4"]
)
def test_cuda_kernel_matches_reference_on_a_serving_batch(config: str) -> None:
    from pa_oracle.oracle.fused import fused_reference

    case = _serving_like_case()
    tensors = make_tensors(case, "cuda")
    fused = fused_reference(case, tensors, logit_noise=True, config=_config(config))
    assert fused is not None
    _assert_matches(fused, reference(case, tensors, logit_noise=True, engine="torch"), case)
    again = fused_reference(case, tensors, logit_noise=True, config=_config(config))
    assert again is not None and torch.equal(again.out, fused.out) and torch.equal(again.lse, fused.lse), "not deterministic"
    assert again.logit_noise is not None and fused.logit_noise is not None and torch.equal(again.logit_noise, fused.logit_noise)


@needs_cuda
@pytest.mark.gpu
def test_cuda_side_stream_changes_no_bit() -> None:
    from dataclasses import replace

    from pa_oracle.oracle.fused import fused_reference

    case = _serving_like_case()
    tensors = make_tensors(case, "cuda")
    side, inline = (fused_reference(case, tensors, config=replace(DEFAULT_CONFIG, side_stream=s)) for s in (True, False))
    assert side is not None and inline is not None
    assert torch.equal(side.out, inline.out) and torch.equal(side.lse, inline.lse)


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("logit_noise", [False, True])
def test_cuda_kernel_does_not_sync_the_stream(logit_noise: bool) -> None:
    from pa_oracle.oracle.fused import fused_reference

    # a prefill tile, decode tiles on the side stream, one context split into chunks and merged
    case = Case(Layout.from_lengths([1, 40, 3], [3000, 90, 0], page_size=16), Heads(8, 2, 128, 128), Options(causal=True, sinks=(1.0,) * 8, q_dtype="bfloat16", kv_dtype="bfloat16"), seed=2)
    tensors = make_tensors(case, "cuda")
    fused_reference(case, tensors, logit_noise=logit_noise)  # compile outside the checked region
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fused = fused_reference(case, tensors, logit_noise=logit_noise)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert fused is not None
    _assert_matches(fused, reference(case, tensors, logit_noise=logit_noise, engine="torch"), case)


def _compiled_kernels(kernel: object) -> int:
    """How many kernels a ``triton.jit`` function holds compiled (its in-memory cache, all devices)."""
    caches = getattr(kernel, "device_caches", None)
    assert caches is not None, "this Triton's JITFunction has no device_caches: count its compiled kernels another way"
    return sum(len(cache[0]) for cache in caches.values())


@needs_cuda
@pytest.mark.gpu
def test_cuda_compiles_exactly_the_distinct_compile_keys() -> None:
    """Triton's own cache against ``compile_keys``: a spread of group sizes, page sizes and options
    compiles one kernel per distinct key (a config no other test uses, so every key is new)."""
    from pa_oracle.oracle import _fused_kernel as fk
    from pa_oracle.oracle.fused import compile_keys, fused_reference

    config = dataclasses.replace(_config("64x32w4-split64"), max_registers=254)
    every = _spread(head_dim=128)
    spread = [every[4 * i + i % 4] for i in range(16)]  # group sizes 1-4, page sizes 1, 5, 16, each option on and off
    before = _compiled_kernels(fk.attention) + _compiled_kernels(fk.merge)
    keys: set[tuple] = set()
    for case, noise in spread:
        tensors = make_tensors(case, "cuda")
        keys |= compile_keys(case, tensors, logit_noise=noise, config=config)
        fused = fused_reference(case, tensors, logit_noise=noise, config=config)
        assert fused is not None
        _assert_matches(fused, reference(case, tensors, logit_noise=noise, engine="torch"), case)
    compiled = _compiled_kernels(fk.attention) + _compiled_kernels(fk.merge) - before
    assert compiled == len(keys) == len(_by_tile_shape(keys)), f"{compiled} kernels compiled, {len(keys)} compile keys, {len(_by_tile_shape(keys))} tile shapes"


def test_alibi_before_the_soft_cap_is_left_to_the_torch_engine() -> None:
    from pa_oracle.oracle.fused import unsupported_reason

    case = Case(Layout.from_lengths([1], [3], page_size=2), Heads(1, 1, 8, 8), Options(logits_soft_cap=5.0, alibi_slopes=(0.5,)))
    assert unsupported_reason(case) is None
    flashinfer_order = case.replace(options=dataclasses.replace(case.options, soft_cap_alibi_order="alibi-then-cap"))
    assert "torch engine" in unsupported_reason(flashinfer_order)
    no_cap = flashinfer_order.replace(options=dataclasses.replace(flashinfer_order.options, logits_soft_cap=0.0))
    assert unsupported_reason(no_cap) is None  # the order matters only with both on
