#!/usr/bin/env bash
# issue 14, helper "ledger": the stale-custom-mask finding as a golden case judged by the mask-replan check.
#  1. FlashInfer alone (no pa_oracle): one BatchPrefillWithRaggedKVCacheWrapper / BatchPrefillWithPagedKVCacheWrapper
#     planned with a custom mask, run, planned again WITHOUT one (causal), run; compared with a fresh wrapper planned
#     causal. Prints, per wrapper, whether plan() has the `self._custom_mask_buf = None` reset, and max |out diff|.
#  2. `pa-oracle replay` of golden/cases/flashinfer-ragged-stale-custom-mask.json (judged through mask-replan) and
#     golden/cases/flashinfer-prefill-mask-empty-row-lse.json (the oracle) on flashinfer-ragged-mask,
#     flashinfer-prefill-mask-replan and flashinfer-prefill-mask, against golden/ledger.json (--json record kept).
# Success (FlashInfer 0.6.18.post1):
#   (1) "Ragged... reset: False ... stale: True" (diff > 0.1) and "Paged... reset: True ... stale: False" (diff 0);
#   (2) lines  flashinfer-ragged-stale-custom-mask on flashinfer-ragged-mask (mask-replan): fail - known finding (...pull/2690)
#              flashinfer-ragged-stale-custom-mask on flashinfer-prefill-mask-replan (mask-replan): pass
#              flashinfer-ragged-stale-custom-mask on flashinfer-prefill-mask (mask-replan): unsupported (masks-only adapter)
#              flashinfer-prefill-mask-empty-row-lse on flashinfer-prefill-mask(-replan): fail - known finding
#   and for flashinfer-prefill-mask-empty-row-lse on flashinfer-ragged-mask: either "pass", or ">>> ... fail - fails and
#   no ledger entry covers it" with "empty rows have lse [-3465x...]": then the ragged kernel has the same sentinel and that
#   entry's families need "flashinfer-ragged-fa2" (the replay then exits 1; that is the answer, not a script failure).
# A "FIXED"/"unexpected-pass" on the stale case means this FlashInfer clears the ragged mask: narrow the entry's range.
# Optional: LEDGER_SECOND_SITE=/path/to/site-packages with FlashInfer 0.7.2.post1 repeats step 1 with that FlashInfer.
# Wall time: < 2 min (each step has a timeout; JIT compiles of the mask modules are most of it). Logs: $OUT/ledger/.
set -u
L="$OUT/ledger"; mkdir -p "$L"
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-16}
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
START=$(date +%s)
cat > /tmp/ledger_direct.py <<'PY'
import inspect
import flashinfer, torch
from flashinfer.prefill import BatchPrefillWithPagedKVCacheWrapper as Paged, BatchPrefillWithRaggedKVCacheWrapper as Ragged

print(f"flashinfer {flashinfer.__version__} ({flashinfer.__file__}), torch {torch.__version__}, {torch.cuda.get_device_name()}")
torch.manual_seed(0)
dev, dt, H, Hkv, D, page = "cuda", torch.bfloat16, 4, 2, 64, 4
qo, kv = [4, 3], [21, 6]
qo_indptr = torch.tensor([0, 4, 7], dtype=torch.int32, device=dev)
kv_indptr = torch.tensor([0, 21, 27], dtype=torch.int32, device=dev)
q = torch.randn(7, H, D, dtype=dt, device=dev)
k, v = (torch.randn(27, Hkv, D, dtype=dt, device=dev) for _ in range(2))
mask = torch.cat([(torch.rand(a * b, device=dev) < 0.5) for a, b in zip(qo, kv)])
ws = lambda: torch.empty(128 << 20, dtype=torch.uint8, device=dev)
kw = dict(q_data_type=dt, kv_data_type=dt)

def ragged(w, **m):
    w.plan(qo_indptr, kv_indptr, H, Hkv, D, **m, **kw)
    return w.run(q, k, v)

pages = [(n + page - 1) // page for n in kv]
p_indptr = torch.tensor([0, pages[0], sum(pages)], dtype=torch.int32, device=dev)
p_indices = torch.arange(sum(pages), dtype=torch.int32, device=dev)
last = torch.tensor([(n - 1) % page + 1 for n in kv], dtype=torch.int32, device=dev)
cache = torch.zeros(sum(pages), 2, page, Hkv, D, dtype=dt, device=dev)
tok = 0
for b, n in enumerate(kv):
    for t in range(n):
        pg, sl = int(p_indptr[b]) + t // page, t % page
        cache[pg, 0, sl], cache[pg, 1, sl] = k[tok], v[tok]
        tok += 1

def paged(w, **m):
    w.plan(qo_indptr, p_indptr, p_indices, last, H, Hkv, D, page, **m, **kw)
    return w.run(q, cache)

for cls, call in ((Ragged, ragged), (Paged, paged)):
    reset = "self._custom_mask_buf = None" in inspect.getsource(cls.plan)
    fresh = call(cls(ws(), "NHD"), causal=True)
    w = cls(ws(), "NHD")
    call(w, custom_mask=mask)
    again = call(w, causal=True)
    diff = float(torch.nan_to_num((again.float() - fresh.float()).abs(), nan=float("inf")).max())  # a NaN is a difference
    print(f"{cls.__name__}: plan resets _custom_mask_buf: {reset}; mask plan then causal re-plan vs fresh causal: "
          f"max |out diff| {diff:.4g} -> stale: {diff > 1e-3}")
PY
echo "== 1. FlashInfer alone" | tee "$L/ledger.log"
timeout 70 python3 /tmp/ledger_direct.py 2>&1 | tail -n 8 | tee -a "$L/ledger.log"
if [ -n "${LEDGER_SECOND_SITE:-}" ]; then
  echo "== 1b. with $LEDGER_SECOND_SITE" | tee -a "$L/ledger.log"
  PYTHONPATH="$LEDGER_SECOND_SITE:$PYTHONPATH" timeout 40 python3 /tmp/ledger_direct.py 2>&1 | tail -n 8 | tee -a "$L/ledger.log"
fi
left=$(( 110 - ($(date +%s) - START) )); [ $left -lt 20 ] && left=20
echo "== 2. pa-oracle replay against the ledger (limit ${left} s)" | tee -a "$L/ledger.log"
timeout $left python3 -m pa_oracle replay golden/cases/flashinfer-ragged-stale-custom-mask.json \
  golden/cases/flashinfer-prefill-mask-empty-row-lse.json -b flashinfer-ragged-mask -b flashinfer-prefill-mask-replan \
  -b flashinfer-prefill-mask --json --output "$L/replay.json" > /dev/null 2> "$L/replay.err"
echo "replay rc=$? after $(( $(date +%s) - START )) s" | tee -a "$L/ledger.log"
grep -E " on flashinfer-|^replayed|Error" "$L/replay.err" | cut -c1-400 | tail -n 12 | tee -a "$L/ledger.log"
