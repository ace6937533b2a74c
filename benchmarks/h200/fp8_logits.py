"""How precise are FlashInfer fa3 fp8 prefill's logits (the basis of ``oracle.reference.fp8_logit_noise``)?

Run on an sm90 GPU with the fa3 fp8 module built (`pa-oracle warmup -b flashinfer-prefill-fa3-fp8 --only head_dims=128
--only o_dtypes=bfloat16 --only window_left=false`): `FP8ACC_DIMS=128 python benchmarks/h200/fp8_logits.py`. H200,
0.6.18.post1, 2026-12-01: 6,144 rows, err/A max 1.68e-04 (2^-12.5), median 6.9e-06; err/|s| up to 0.26; max err 8.0e-03.
 Rows with ONE key have LSE = logit, so |lse - s64| is the
logit's error (s64 = sm_scale * q.k in float64 over the stored fp8 values). Printed against |s| (an fp32 rounding of s
would give <= 2^-24 |s|) and against A = sm_scale * sum_i |q_i k_i| (an accumulator keeping b bits: ~2^-b A)."""
import math, sys, time
import torch
from pa_oracle.backends import get_backend
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle import tensors as T

b = get_backend("flashinfer-prefill-fa3-fp8")
print("unavailable:", b.unavailable_reason())
rows = []
t0 = time.time()
DIMS = [int(x) for x in __import__("os").environ.get("FP8ACC_DIMS", "64,128,256").split(",")]
for seed, (dist, dim, hq, hkv) in enumerate([("normal", 128, 32, 8), ("normal", 64, 16, 16), ("peaked", 128, 32, 4), ("normal", 256, 8, 8)] * 2):
    if dim not in DIMS:
        continue
    B = 48
    lay = Layout.from_lengths([1 + (i % 4) for i in range(B)], [1 + (i % 4) for i in range(B)], 16)
    # causal, qo == kv: each request's first row sees exactly key 0
    case = Case(lay, Heads(hq, hkv, dim, dim), Options(causal=True, q_dtype="float8_e4m3fn", kv_dtype="float8_e4m3fn", o_dtype="bfloat16"), seed=seed, distribution=dist)
    t = T.make_tensors(case, "cuda")
    plan = b.plan(case)
    lse = b.run(plan, t).lse.double()  # natural log (the adapter converts base 2)
    q = t.q.double(); k = t.k_cache.double()
    pages, slots = (x.to("cuda") for x in T.token_addresses(case))
    keys = k[pages, slots]  # [total_kv, Hkv, D] in request order
    g = hq // hkv
    starts_q, starts_k = lay.qo_indptr, [0]
    for n in lay.kv_lens: starts_k.append(starts_k[-1] + n)
    for r in range(B):
        qi, ki = starts_q[r], starts_k[r]  # first query row, key 0
        for h in range(hq):
            prod = q[qi, h] * keys[ki, h // g] * case.sm_scale
            s, A = prod.sum().item(), prod.abs().sum().item()
            rows.append((abs(lse[qi, h].item() - s), abs(s), A, dim, dist))
    torch.cuda.synchronize()
print(f"{len(rows)} one-key rows in {time.time() - t0:.1f}s")
import statistics
for label, sel in (("all", rows), ("dim 64", [x for x in rows if x[3] == 64]), ("dim 128", [x for x in rows if x[3] == 128]), ("dim 256", [x for x in rows if x[3] == 256]), ("peaked", [x for x in rows if x[4] == "peaked"])):
    if not sel: continue
    rs = sorted(e / max(s, 1e-30) for e, s, A, *_ in sel); ra = sorted(e / max(A, 1e-30) for e, s, A, *_ in sel)
    q = lambda v, f: v[min(len(v) - 1, int(f * len(v)))]
    print(f"{label}: n {len(sel)}; err/|s| median {q(rs,.5):.2e} p99 {q(rs,.99):.2e} max {rs[-1]:.2e}; err/A median {q(ra,.5):.2e} p99 {q(ra,.99):.2e} max {ra[-1]:.2e} "
          f"(= 2^-{-math.log2(max(ra[-1],1e-30)):.1f}); exact {sum(e == 0 for e, *_ in sel)}; max err {max(e for e, *_ in sel):.2e}")
