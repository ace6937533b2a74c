"""Fused float64 oracle (``oracle.fused``) vs the torch oracle vs FlashInfer, on CUDA (a benchmark,
not a timed test): times, ratios, max |fused - reference|, and a tile-size sweep.

    python benchmarks/fused_oracle_speed.py              # serving batch and fuzz-sized batch, then the sweep
    python benchmarks/fused_oracle_speed.py --no-sweep   # skip the tile sweep
    python benchmarks/fused_oracle_speed.py --repeat 10

FlashInfer (decode with tensor cores + FA2 prefill) is timed on the serving batch when installed.
"""

from __future__ import annotations

import argparse
import itertools

import torch

from benchmarks.oracle_speed import flashinfer_time, fuzz_sized_case, serving_case, timed
from oracle.case import Case
from oracle.fused import DEFAULT_CONFIG, FusedConfig, fused_reference
from oracle.reference import reference
from oracle.tensors import make_tensors

SWEEP = [
    FusedConfig(block_m=m, block_n=n, num_warps=w, small_num_warps=s)
    for m, n, w, s in itertools.product((64, 128), (32, 64), (4, 8), (4,))
] + [FusedConfig(small_num_warps=s, block_n=n) for s, n in ((2, 32), (8, 32), (2, 64), (4, 64))]


def _fused(case: Case, tensors, config: FusedConfig):  # type: ignore[no-untyped-def]
    result = fused_reference(case, tensors, config=config)
    if result is None:
        raise SystemExit("fused_reference declined the case (triton missing?)")
    return result


def _flops(case: Case) -> float:
    """Float64 multiply-adds x 2 of the attended (query, key) pairs (QK and PV), per the mask."""
    lay, heads = case.layout, case.heads
    pairs = 0
    for qo, kv in zip(lay.qo_lens, lay.kv_lens):
        for i in range(qo):
            pos = kv - qo + i
            pairs += max(0, min(kv, pos + 1)) if case.options.causal else kv
    return 2.0 * pairs * heads.num_qo_heads * (heads.head_dim_qk + heads.head_dim_vo)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    both_inf = torch.isneginf(a) & torch.isneginf(b)
    return float(torch.where(both_inf, 0.0, a - b).abs().max()) if a.numel() else 0.0


def report(name: str, case: Case, repeat: int, with_flashinfer: bool) -> None:
    tensors = make_tensors(case, "cuda")
    lay = case.layout
    print(f"{name}: {lay.batch_size} requests, {lay.total_q} queries, {sum(lay.kv_lens)} keys, "
          f"{case.heads.num_qo_heads}/{case.heads.num_kv_heads} heads, dim {case.heads.head_dim_qk}, "
          f"{_flops(case) / 1e9:.1f} GFLOP attended")  # fmt: skip
    fused_t = timed(lambda: _fused(case, tensors, DEFAULT_CONFIG), "cuda", repeat)
    torch_t = timed(lambda: reference(case, tensors), "cuda", repeat)
    ref, fused = reference(case, tensors), _fused(case, tensors, DEFAULT_CONFIG)
    print(f"  fused oracle (float64, {DEFAULT_CONFIG}): {fused_t * 1e3:.3f} ms ({_flops(case) / fused_t / 1e12:.1f} TFLOP/s)")
    print(f"  torch oracle (float64): {torch_t * 1e3:.3f} ms -> fused is {torch_t / fused_t:.1f}x faster")
    print(f"  max |fused - reference|: out {_max_diff(fused.out, ref.out):.3g}, lse {_max_diff(fused.lse, ref.lse):.3g} "
          f"(|out| max {float(ref.out.abs().max()):.3g})")  # fmt: skip
    if with_flashinfer:
        kernel = flashinfer_time(case, tensors)
        print(f"  FlashInfer decode(tc) + prefill(fa2): {kernel * 1e3:.3f} ms -> fused / FlashInfer = {fused_t / kernel:.1f}x, "
              f"torch oracle / FlashInfer = {torch_t / kernel:.1f}x")  # fmt: skip


def sweep(case: Case, repeat: int) -> None:
    tensors = make_tensors(case, "cuda")
    ref = reference(case, tensors)
    print("tile sweep on the serving batch (best of the timed runs; small = tiles of <= 64 packed rows):")
    results = []
    for config in SWEEP:
        try:
            t = timed(lambda: _fused(case, tensors, config), "cuda", repeat)
        except Exception as exc:  # noqa: BLE001 - a config the compiler rejects (shared memory) is a result
            print(f"  {config}: failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
            continue
        err = _max_diff(_fused(case, tensors, config).out, ref.out)
        results.append((t, config))
        print(f"  block_m {config.block_m:3d} block_n {config.block_n:2d} warps {config.num_warps} small warps "
              f"{config.small_num_warps}: {t * 1e3:7.3f} ms  {_flops(case) / t / 1e12:5.1f} TFLOP/s  max|d out| {err:.2g}")  # fmt: skip
    if results:
        best_t, best = min(results, key=lambda r: r[0])
        print(f"best: {best} at {best_t * 1e3:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs after a warm-up; the best counts")
    parser.add_argument("--no-sweep", action="store_true", help="skip the tile-size sweep")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    try:
        import flashinfer  # noqa: F401

        with_flashinfer = True
    except ImportError:
        with_flashinfer = False
        print("FlashInfer not installed: timing the fused and torch oracles only")
    report("serving batch", serving_case(), args.repeat, with_flashinfer)
    report("fuzz-sized batch", fuzz_sized_case(), args.repeat, False)
    if not args.no_sweep:
        sweep(serving_case(), args.repeat)


if __name__ == "__main__":
    main()
