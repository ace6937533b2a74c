#!/usr/bin/env bash
# issue 15, helper "rope", optional second script: FlashInfer POD (BatchPODWithPagedKVCacheWrapper) on the H200.
# Its fused module is not in the AOT wheel: `pa-oracle warmup` compiles it by judging one case (build_variants is
# None for this adapter), then a campaign draws inside that key (bf16, hd128, no window).
# Prints: warmup status line ("built 1 of 1" = the module compiled and the case ran), then the campaign: status,
#   examples, passed, unsupported (batches without both a decode and a prefill request are skipped), worst ratio.
# Success: built 1 of 1; campaign complete with > 0 passed examples, 0 findings, worst ratio < 1. A finding is a lead
#   (POD's row reassembly is this adapter's: check the report's rows first).
# Wall time < 4 min (global 225 s deadline). Logs: $OUT/rope-pod/ (<= 3 files).
set -u
L="$OUT/rope-pod"; T=/tmp/rope-pod; mkdir -p "$L" "$T"
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-16}
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
START=$(date +%s); LOG="$L/pod.log"
POD=(-b flashinfer-pod --only q_dtypes=bfloat16 --only kv_dtypes= --only head_dims=128 --only window_left=false)
timeout 170 python3 -m pa_oracle warmup "${POD[@]}" --variants 1 > "$T/warm.out" 2>&1; echo "warmup rc=$? after $(( $(date +%s) - START )) s" | tee -a "$LOG"
tail -n 5 "$T/warm.out" | tee -a "$LOG"
LEFT=$(( 215 - ($(date +%s) - START) ))
if [ $LEFT -gt 25 ]; then
  timeout $LEFT python3 -m pa_oracle fuzz "${POD[@]}" -n 300 --time-budget $(( LEFT - 15 )) --compile-budget 1 --json \
    --out "$T/pod" > "$T/pod.out" 2> "$T/pod.err"; echo "campaign rc=$?" | tee -a "$LOG"
  python3 - "$T" <<'PY' | tee -a "$LOG"
import json, sys
from pathlib import Path
text = (Path(sys.argv[1]) / "pod.out").read_text()
rows = json.loads(text[text.index("["):]) if "[" in text else []
for r in rows:
    print(f"== {r['backend']}: {r['status']}, {r['examples']} examples, passed {r['passed']}, unsupported {r['unsupported']}, "
          f"worst ratio {r['worst_ratio']}, {r['seconds']} s, notes {r['notes']}")
    if r.get("finding"):
        print(f"   FINDING: {json.dumps(r['finding'])[:900]}")
if not rows:
    print("no JSON; stderr tail:", (Path(sys.argv[1]) / "pod.err").read_text()[-600:])
PY
  found=$(find "$T/pod" -name case.json | head -1); [ -n "$found" ] && cp "$found" "$L/finding-case.json"
else
  echo "campaign skipped: out of time" | tee -a "$LOG"
fi
echo "total $(( $(date +%s) - START )) s" | tee -a "$LOG"
