"""Fused float64 oracle (``pa_oracle.oracle.fused``) vs the torch oracle vs FlashInfer, on CUDA (a benchmark,
not a timed test): times, ratios, max |fused - reference|, the decode-only and prefill-only halves
of the serving batch, the cost of ``logit_noise``, and a config sweep.

    python benchmarks/fused_oracle_speed.py              # serving batch and fuzz-sized batch, then the sweep
    python benchmarks/fused_oracle_speed.py --no-sweep   # skip the config sweep
    python benchmarks/fused_oracle_speed.py --repeat 10
    python benchmarks/fused_oracle_speed.py --specializations  # runtime flags vs the constexpr kernel
                                                               # (issue 12; fused_specializations.py)

FlashInfer (decode with tensor cores + FA2 prefill) is timed on the serving batch when installed.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch
from oracle_speed import (  # the sibling script (benchmarks/ is sys.path[0])
    flashinfer_time,
    fuzz_sized_case,
    serving_case,
    timed,
)
from pa_oracle.oracle.case import Case, Layout
from pa_oracle.oracle.fused import DEFAULT_CONFIG, FusedConfig, fused_reference
from pa_oracle.oracle.reference import reference
from pa_oracle.oracle.tensors import make_tensors

# one knob at a time around the default (block_m 128 x block_n 64, 8 warps, decode split at 512 keys
# on a side stream, a plain loop, maxnreg 255), then a few pairs; num_warps 4 on 128-row tiles was
# measured 7x slower (spills) and is left out
SWEEP = [
    DEFAULT_CONFIG,
    *(replace(DEFAULT_CONFIG, split_keys=n) for n in (0, 256, 1024, 2048)),
    replace(DEFAULT_CONFIG, side_stream=False),
    replace(DEFAULT_CONFIG, split_keys=0, side_stream=False),
    *(replace(DEFAULT_CONFIG, num_stages=n) for n in (2, 3)),
    replace(DEFAULT_CONFIG, block_n=32),
    replace(DEFAULT_CONFIG, block_n=32, num_stages=2),
    replace(DEFAULT_CONFIG, block_n=32, num_stages=3),
    *(replace(DEFAULT_CONFIG, small_num_warps=n) for n in (2, 8)),
    replace(DEFAULT_CONFIG, max_registers=0),
    replace(DEFAULT_CONFIG, block_m=64),
]


def _fused(case: Case, tensors, config: FusedConfig, logit_noise: bool = False):  # type: ignore[no-untyped-def]
    result = fused_reference(case, tensors, logit_noise=logit_noise, config=config)
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


def halves(case: Case) -> tuple[Case, Case]:
    """The decode-only (qo_len 1) and prefill-only requests of ``case``, each on its own pool."""
    lay = case.layout

    def keep(decode: bool) -> Case:
        pairs = [(q, k) for q, k in zip(lay.qo_lens, lay.kv_lens) if (q == 1) == decode]
        return case.replace(layout=Layout.from_lengths([q for q, _ in pairs], [k for _, k in pairs], lay.page_size))

    return keep(True), keep(False)


def report(name: str, case: Case, repeat: int, with_flashinfer: bool) -> None:
    tensors = make_tensors(case, "cuda")
    lay = case.layout
    print(f"{name}: {lay.batch_size} requests, {lay.total_q} queries, {sum(lay.kv_lens)} keys, "
          f"{case.heads.num_qo_heads}/{case.heads.num_kv_heads} heads, dim {case.heads.head_dim_qk}, "
          f"{_flops(case) / 1e9:.1f} GFLOP attended")  # fmt: skip
    fused_t = timed(lambda: _fused(case, tensors, DEFAULT_CONFIG), "cuda", repeat)
    noise_t = timed(lambda: _fused(case, tensors, DEFAULT_CONFIG, logit_noise=True), "cuda", repeat)
    torch_t = timed(lambda: reference(case, tensors, engine="torch"), "cuda", repeat)
    torch_noise_t = timed(lambda: reference(case, tensors, logit_noise=True, engine="torch"), "cuda", repeat)
    ref, fused = reference(case, tensors, logit_noise=True, engine="torch"), _fused(case, tensors, DEFAULT_CONFIG, logit_noise=True)
    print(f"  fused oracle (float64, {DEFAULT_CONFIG}): {fused_t * 1e3:.3f} ms ({_flops(case) / fused_t / 1e12:.1f} TFLOP/s)")
    print(f"  torch oracle (float64): {torch_t * 1e3:.3f} ms -> fused is {torch_t / fused_t:.1f}x faster")
    print(f"  with logit_noise (what the fuzz runner asks for): fused {noise_t * 1e3:.3f} ms, torch {torch_noise_t * 1e3:.3f} ms "
          f"-> fused is {torch_noise_t / noise_t:.1f}x faster")  # fmt: skip
    assert fused.logit_noise is not None and ref.logit_noise is not None
    noise_err = float((fused.logit_noise - ref.logit_noise).abs().max()) / max(float(ref.logit_noise.abs().max()), 1e-300)
    print(f"  max |fused - reference|: out {_max_diff(fused.out, ref.out):.3g}, lse {_max_diff(fused.lse, ref.lse):.3g} "
          f"(|out| max {float(ref.out.abs().max()):.3g}), logit_noise {noise_err:.3g} relative to its max")  # fmt: skip
    if with_flashinfer:
        kernel = flashinfer_time(case, tensors)
        print(f"  FlashInfer decode(tc) + prefill(fa2): {kernel * 1e3:.3f} ms -> fused / FlashInfer = {fused_t / kernel:.1f}x, "
              f"torch oracle / FlashInfer = {torch_t / kernel:.1f}x")  # fmt: skip


def _flashinfer_half_time(case: Case, tensors, decode: bool, repeat: int) -> float:  # type: ignore[no-untyped-def]
    """FlashInfer's decode (tensor cores) or FA2 prefill kernel alone on a one-kind batch."""
    from pa_oracle.backends.flashinfer import FlashInferDecodeTensorCores, FlashInferPrefillFA2

    backend = FlashInferDecodeTensorCores() if decode else FlashInferPrefillFA2()
    plan = backend.plan(case)
    return timed(lambda: backend.run(plan, tensors), "cuda", max(repeat, 10))


def report_halves(case: Case, repeat: int, with_flashinfer: bool) -> None:
    """Where the time goes: each half of the batch alone, with and without the decode split."""
    whole = make_tensors(case, "cuda")
    whole_t = timed(lambda: _fused(case, whole, DEFAULT_CONFIG), "cuda", repeat)
    print(f"serving batch by half (fused, best of {repeat}; the whole batch {whole_t * 1e3:.3f} ms):")
    total = 0.0
    for name, half in zip(("decode-only", "prefill-only"), halves(case)):
        tensors = make_tensors(half, "cuda")
        t = timed(lambda: _fused(half, tensors, DEFAULT_CONFIG), "cuda", repeat)
        total += t
        line = f"  {name}: {half.layout.batch_size} requests, {_flops(half) / 1e9:.1f} GFLOP: {t * 1e3:.3f} ms ({_flops(half) / t / 1e12:.2f} TFLOP/s)"
        if name == "decode-only":
            unsplit = timed(lambda: _fused(half, tensors, replace(DEFAULT_CONFIG, split_keys=0)), "cuda", repeat)
            line += f"; unsplit {unsplit * 1e3:.3f} ms"
        if with_flashinfer:
            kernel = _flashinfer_half_time(half, tensors, decode=name == "decode-only", repeat=repeat)
            line += f"; FlashInfer {kernel * 1e3:.3f} ms -> {t / kernel:.1f}x"
        print(line)
    print(f"  sum of the halves {total * 1e3:.3f} ms vs the whole {whole_t * 1e3:.3f} ms (the side stream overlaps them)")


def sweep(case: Case, repeat: int) -> None:
    tensors = make_tensors(case, "cuda")
    ref = reference(case, tensors, engine="torch")
    decode, _ = halves(case)
    decode_tensors = make_tensors(decode, "cuda")
    print("config sweep on the serving batch (best of the timed runs; decode = the decode-only half alone):")
    results = []
    for config in SWEEP:
        try:
            t = timed(lambda: _fused(case, tensors, config), "cuda", repeat)
            decode_t = timed(lambda: _fused(decode, decode_tensors, config), "cuda", repeat)
        except Exception as exc:  # noqa: BLE001 - a config the compiler rejects (shared memory) is a result
            print(f"  {config}: failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
            continue
        err = _max_diff(_fused(case, tensors, config).out, ref.out)
        results.append((t, config))
        print(f"  {t * 1e3:7.3f} ms  {_flops(case) / t / 1e12:5.1f} TFLOP/s  decode {decode_t * 1e3:6.3f} ms  "
              f"max|d out| {err:.2g}  {config}")  # fmt: skip
    if results:
        best_t, best = min(results, key=lambda r: r[0])
        print(f"best: {best} at {best_t * 1e3:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs after a warm-up; the best counts")
    parser.add_argument("--no-sweep", action="store_true", help="skip the config sweep")
    parser.add_argument("--specializations", action="store_true", help="only the runtime-flag kernel vs the constexpr one (fused_specializations.py)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    if args.specializations:
        from fused_specializations import main as specializations

        specializations(["--repeat", str(args.repeat)])
        return
    try:
        import flashinfer  # noqa: F401

        with_flashinfer = True
    except ImportError:
        with_flashinfer = False
        print("FlashInfer not installed: timing the fused and torch oracles only")
    report("serving batch", serving_case(), args.repeat, with_flashinfer)
    report_halves(serving_case(), args.repeat, with_flashinfer)
    report("fuzz-sized batch", fuzz_sized_case(), args.repeat, False)
    if not args.no_sweep:
        sweep(serving_case(), args.repeat)


if __name__ == "__main__":
    main()
