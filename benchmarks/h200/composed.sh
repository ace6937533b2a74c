#!/usr/bin/env bash
# issue 15, helper "composed": the composed-vs-parts check on FlashInfer's POD and cascade, and the fp8-q fa3 prefill.
#  0. preflight: versions; whether the installed FlashInfer's paged run hands an fp8 q's positional *args to the kernel as
#     scale_q/k/v (read in v0.6.18rc7's prefill.py: "fp8_scale_q = args[0]") and its fa3 fp8 template exists.
#  1. flashinfer-prefill-fa3-fp8: warmup (one fa3 fp8 module: e4m3 q/kv, bf16 out, hd128, no window) in the BACKGROUND
#     while 2 runs, then fuzz -n 200 --time-budget <= 60 inside that key.
#  2. flashinfer-pod: warmup (its POD module + the fa2 prefill module its parts use), then `metamorphic -c composed-vs-parts`.
#  3. flashinfer-cascade: warmup (fa2, prebuilt) and `metamorphic -c composed-vs-parts` (runs while 1's fuzz runs).
# Prints one summary line per campaign: status, examples, passed, unsupported, worst ratio, seconds, finding (900 chars).
# Success: preflight prints "positional fp8 scales: True"; POD and cascade complete with > 0 passed examples and no
#   finding (a finding is a lead: the message names composed vs parts and both oracle verdicts); the fp8 warmup prints
#   "built 1 of 1" and the fuzz passes > 0 examples with worst ratio < 3 and no finding (a finding: read its message:
#   a ratio near the limit on many cases means the control's P rounding does not match the kernel's).
# Wall time < 8 min: one global 420 s deadline; each step has its own timeout. Logs: $OUT/composed/ (<= 4 files).
# Compiles (H200, 2026-12-01, side by side on the 16 cores): POD's module ~290 s (its warm-up judges a case, so the
# module is built where the campaign looks), the fa3 fp8 one ~210 s. The fp8 warm-up now builds its module with its own
# ninja (backends.flashinfer.build_modules); before, the campaign's first case rebuilt it (build_jit_specs' ninja log
# is not the module's: 121 s), so no fp8 case was judged.
# If a warm-up runs out of time (rc=124), run the script again at once on the warm machine (ninja resumes).
# COMPOSED_PARTS (default "pod cascade fp8") picks the campaigns.
set -u
L="$OUT/composed"; T=/tmp/composed; mkdir -p "$L" "$T"
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
START=$(date +%s); LOG="$L/composed.log"; PARTS=" ${COMPOSED_PARTS:-pod cascade fp8} "
asked() { case "$PARTS" in *" $1 "*) return 0;; esac; return 1; }
want() { asked "$1" && return 0; echo "$1: not asked (COMPOSED_PARTS)" | tee -a "$LOG"; return 1; }
left() { echo $(( ${COMPOSED_SECONDS:-420} - ($(date +%s) - START) )); }
summary() {  # NAME: the JSON rows of $T/NAME.out
  python3 - "$T" "$1" <<'PY' | tee -a "$LOG"
import json, sys
from pathlib import Path
out, name = Path(sys.argv[1]), sys.argv[2]
text = (out / f"{name}.out").read_text() if (out / f"{name}.out").exists() else ""
rows = json.loads(text[text.index("["):]) if "[" in text else []
for r in rows:  # fuzz rows: passed/unsupported/worst_ratio/finding; check rows: held/skipped/bit_exact/violation
    print(f"== {name} {r.get('backend')} [{r.get('check', 'oracle')}]: {r.get('status')}, {r.get('examples')} examples, "
          f"passed {r.get('passed', r.get('held'))}, unsupported {r.get('unsupported', r.get('skipped'))}, "
          f"worst ratio {r.get('worst_ratio')}, bit-exact {r.get('bit_exact')}, {r.get('seconds')} s, notes {r.get('notes')}")
    found = r.get("finding") or r.get("violation")
    if found:
        print(f"   FINDING: {json.dumps(found)[:900]}")
if not rows:
    err = out / f"{name}.err"
    print(f"== {name}: no JSON; stderr tail:", err.read_text()[-700:] if err.exists() else "(none)")
PY
}
python3 - <<'PY' 2>&1 | tee -a "$LOG"
import inspect
import flashinfer, torch
from flashinfer.prefill import BatchPrefillWithPagedKVCacheWrapper as Paged
from flashinfer.jit.attention import modules
print(f"flashinfer {flashinfer.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
print("positional fp8 scales:", "fp8_scale_q = args[0]" in inspect.getsource(Paged.run))
print("fa3 fp8 template:", "batch_prefill_fp8_sm90.cu" in inspect.getsource(modules))
from pa_oracle.backends import get_backend
for name in ("flashinfer-pod", "flashinfer-cascade", "flashinfer-prefill-fa3-fp8"):
    b = get_backend(name)
    print(name, "parts:", [tuple(p) for p in b.parts], "unavailable:", b.unavailable_reason())
PY
FP8=(-b flashinfer-prefill-fa3-fp8 --only head_dims=128 --only o_dtypes=bfloat16 --only window_left=false)
POD=(-b flashinfer-pod --only q_dtypes=bfloat16 --only kv_dtypes= --only head_dims=128 --only window_left=false --only max_group_size=16)  # 32: the recorded decode-tile finding
CAS=(-b flashinfer-cascade --only q_dtypes=bfloat16 --only kv_dtypes= --only head_dims=128 --only logits_soft_cap=false)  # the fa2 module POD's warmup built
# 1. the fp8 module compiles in the background (10 of 16 cores) while POD's builds with the rest
WARM_FP8=""
want fp8 && { ( MAX_JOBS=$(asked pod && echo 8 || echo 16) timeout 320 python3 -m pa_oracle warmup "${FP8[@]}" --variants 1 > "$T/fp8-warm.out" 2>&1;
  echo "fp8 warmup rc=$? after $(( $(date +%s) - START )) s" >> "$T/fp8-warm.out" ) & WARM_FP8=$!; }
if want pod; then
  MAX_JOBS=$(asked fp8 && echo 8 || echo 16) timeout 320 python3 -m pa_oracle warmup "${POD[@]}" --variants 1 > "$T/pod-warm.out" 2>&1
  echo "pod warmup rc=$? after $(( $(date +%s) - START )) s" | tee -a "$LOG"; tail -n 4 "$T/pod-warm.out" | tee -a "$LOG"
fi
# 2. POD against its parts
B=$(( $(left) - 80 )); [ $B -gt 45 ] && B=45
if ! asked pod; then :
elif [ $B -gt 10 ]; then
  timeout $(( B + 20 )) python3 -m pa_oracle metamorphic "${POD[@]}" -c composed-vs-parts -n 300 --time-budget $B --json \
    --out "$T/pod" > "$T/pod.out" 2> "$T/pod.err"; echo "pod check rc=$?" | tee -a "$LOG"; summary pod
else echo "pod check skipped: out of time" | tee -a "$LOG"; fi
# 3. fp8 fuzz (background, once its module is built) and the cascade check side by side
FUZZ_FP8=""
[ -n "$WARM_FP8" ] && { wait $WARM_FP8; tail -n 5 "$T/fp8-warm.out" | tee -a "$LOG"; }
F=$(( $(left) - 15 )); [ $F -gt 60 ] && F=60
if [ -z "$WARM_FP8" ]; then :
elif [ $F -gt 10 ]; then
  ( timeout $(( F + 20 )) python3 -m pa_oracle fuzz "${FP8[@]}" -n 200 --time-budget $F --compile-budget 1 --json \
      --out "$T/fp8" > "$T/fp8.out" 2> "$T/fp8.err"; echo "fp8 fuzz rc=$?" >> "$T/fp8.err" ) &
  FUZZ_FP8=$!
else echo "fp8 fuzz skipped: out of time" | tee -a "$LOG"; fi
C=$(( $(left) - 25 )); [ $C -gt 45 ] && C=45
if ! want cascade; then :
elif [ $C -gt 10 ]; then
  timeout 30 python3 -m pa_oracle warmup "${CAS[@]}" --variants 1 > "$T/cas-warm.out" 2>&1; tail -n 2 "$T/cas-warm.out" | tee -a "$LOG"
  C=$(( $(left) - 25 )); [ $C -gt 45 ] && C=45
  timeout $(( C + 20 )) python3 -m pa_oracle metamorphic "${CAS[@]}" -c composed-vs-parts -n 300 --time-budget $C --json \
    --out "$T/cascade" > "$T/cascade.out" 2> "$T/cascade.err"; echo "cascade check rc=$?" | tee -a "$LOG"; summary cascade
else echo "cascade check skipped: out of time" | tee -a "$LOG"; fi
if [ -n "$FUZZ_FP8" ]; then wait $FUZZ_FP8; tail -n 1 "$T/fp8.err" | tee -a "$LOG"; summary fp8; fi
for name in pod cascade fp8; do  # the first saved finding of each, for triage
  found=$(find "$T/$name" -name case.json 2>/dev/null | head -1); [ -n "$found" ] && cp "$found" "$L/$name-finding.json"
done
echo "total $(( $(date +%s) - START )) s" | tee -a "$LOG"
