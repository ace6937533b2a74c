"""How precise are FlashInfer fa3 fp8 prefill's logits (the basis of ``oracle.reference.fp8_logit_noise``)?

Run on an sm90 GPU with the fa3 fp8 module built (`pa-oracle warmup -b flashinfer-prefill-fa3-fp8 --only head_dims=128
--only o_dtypes=bfloat16 --only window_left=false`): `FP8ACC_DIMS=128 python benchmarks/h200/fp8_logits.py`. H200,
0.6.18.post1, 2026-12-01: 6,144 rows, err/A max 1.68e-04 (2^-12.5), median 6.9e-06; err/|s| up to 0.26; max err 8.0e-03.

Rows with ONE key have LSE = logit, so |lse - s64| is the logit's error (s64 = sm_scale * q.k in float64 over the
stored fp8 values). Printed against |s| (an fp32 rounding of s would give <= 2^-24 |s|)
and against A = sm_scale * sum_i |q_i k_i| (an accumulator keeping b bits: ~2^-b A)."""
import math
import os
import time

import torch
from pa_oracle.backends import get_backend
from pa_oracle.oracle import tensors as T
from pa_oracle.oracle.case import Case, Heads, Layout, Options

CONFIGS = [("normal", 128, 32, 8), ("normal", 64, 16, 16), ("peaked", 128, 32, 4), ("normal", 256, 8, 8)] * 2  # (data, dim, Hq, Hkv)
DIMS = [int(x) for x in os.environ.get("FP8ACC_DIMS", "64,128,256").split(",")]  # the head dims whose module is built
FP8 = Options(causal=True, q_dtype="float8_e4m3fn", kv_dtype="float8_e4m3fn", o_dtype="bfloat16")
BATCH = 48


def one_key_rows(backend, seed: int, dist: str, dim: int, hq: int, hkv: int) -> list[tuple[float, float, float, int, str]]:
    """(|lse - s|, |s|, A, dim, dist) of each request's first row: causal with qo == kv, it sees key 0 alone."""
    lens = [1 + (i % 4) for i in range(BATCH)]
    lay = Layout.from_lengths(lens, lens, 16)
    case = Case(lay, Heads(hq, hkv, dim, dim), FP8, seed=seed, distribution=dist)
    t = T.make_tensors(case, "cuda")
    lse = backend.run(backend.plan(case), t).lse.double()  # natural log (the adapter converts base 2)
    q = t.q.double()
    pages, slots = (x.to("cuda") for x in T.token_addresses(case))
    keys = t.k_cache.double()[pages, slots]  # [total_kv, Hkv, D] in request order
    key_starts = [0]
    for n in lay.kv_lens:
        key_starts.append(key_starts[-1] + n)
    found = []
    for r in range(BATCH):
        qi, ki = lay.qo_indptr[r], key_starts[r]
        for h in range(hq):
            prod = q[qi, h] * keys[ki, h // (hq // hkv)] * case.sm_scale
            s, a = prod.sum().item(), prod.abs().sum().item()
            found.append((abs(lse[qi, h].item() - s), abs(s), a, dim, dist))
    return found


def quantile(values: list[float], f: float) -> float:
    return values[min(len(values) - 1, int(f * len(values)))]


def main() -> None:
    backend = get_backend("flashinfer-prefill-fa3-fp8")
    print("unavailable:", backend.unavailable_reason())
    began = time.time()
    rows = [row for seed, (dist, dim, hq, hkv) in enumerate(CONFIGS) if dim in DIMS
            for row in one_key_rows(backend, seed, dist, dim, hq, hkv)]
    torch.cuda.synchronize()
    print(f"{len(rows)} one-key rows in {time.time() - began:.1f}s")
    groups = [("all", rows)] + [(f"dim {d}", [x for x in rows if x[3] == d]) for d in (64, 128, 256)]
    groups.append(("peaked", [x for x in rows if x[4] == "peaked"]))
    for label, sel in groups:
        if not sel:
            continue
        rs = sorted(e / max(s, 1e-30) for e, s, _a, *_ in sel)
        ra = sorted(e / max(a, 1e-30) for e, _s, a, *_ in sel)
        print(f"{label}: n {len(sel)}; err/|s| median {quantile(rs, .5):.2e} p99 {quantile(rs, .99):.2e} max {rs[-1]:.2e}; "
              f"err/A median {quantile(ra, .5):.2e} p99 {quantile(ra, .99):.2e} max {ra[-1]:.2e} "
              f"(= 2^-{-math.log2(max(ra[-1], 1e-30)):.1f}); exact {sum(e == 0 for e, *_ in sel)}; "
              f"max err {max(e for e, *_ in sel):.2e}")


if __name__ == "__main__":
    main()
