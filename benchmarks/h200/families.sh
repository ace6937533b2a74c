#!/usr/bin/env bash
# issue 14, helper "families": short H200 campaigns for the attention-family adapters (custom/tree masks,
# mask->causal plan reuse, MLA on FlashInfer fa2/fa3 and SGLang's Triton decode/extend, sinks) and
# flex-families (tree masks in mask_mod, sinks via score_mod, MLA) on CUDA. Each campaign is narrowed to kernels
# FlashInfer ships prebuilt (bf16, head_dim 64/128) where it can; MLA and the sink wrapper JIT-compile one
# variant each. Total wall time < 5 min (each campaign has its own --time-budget and a hard timeout).
# Prints per backend: status, examples, passed/unsupported, worst error ratio (kernel error / control error),
# the options its cases covered, and any finding (first line + case summary). Success: every backend runs
# (status done/budget, examples > 0, not "unavailable"/error), worst ratio < 1 on passes; a finding is a lead
# (its case saved as $OUT/families/finding-<backend>.json) to triage, not yet a confirmed upstream bug.
set -u
L="$OUT/families"; T=/tmp/families; mkdir -p "$L" "$T"
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-16}
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
echo "flashinfer $(python3 -c 'import flashinfer; print(flashinfer.__version__)' 2>/dev/null || echo none), torch $(python3 -c 'import torch; print(torch.__version__)')"
START=$(date +%s)
campaign() {  # NAME BUDGET_S [--only ...]
  local name=$1 budget=$2; shift 2
  local left=$(( 285 - ($(date +%s) - START) ))
  if [ $left -lt 20 ]; then echo "$name: skipped (out of time)" | tee -a "$L/campaigns.log"; return; fi
  [ $budget -gt $(( left - 15 )) ] && budget=$(( left - 15 ))
  local hard=$(( budget + 90 )); [ $hard -gt $(( left - 5 )) ] && hard=$(( left - 5 ))  # a JIT build may outlast the budget
  timeout $hard python3 -m pa_oracle fuzz -b "$name" -n 400 --time-budget "$budget" --json \
    --out "$T/$name" "$@" > "$T/$name.json" 2> "$T/$name.err"
  echo "$name: rc=$? after $(( $(date +%s) - START )) s; $(tail -c 300 "$T/$name.err" | tr '\n' ' ' | tail -c 200)" >> "$L/campaigns.log"
}
BF16_PREBUILT=(--only q_dtypes=bfloat16 --only kv_dtypes= --only head_dims=64,128)
campaign flashinfer-prefill-mask 35 "${BF16_PREBUILT[@]}"
campaign flashinfer-prefill-mask-replan 25 "${BF16_PREBUILT[@]}"
campaign flashinfer-prefill-packed-mask 20 "${BF16_PREBUILT[@]}"
campaign flashinfer-mla 50 --only q_dtypes=bfloat16 --only kv_dtypes=
campaign flashinfer-sinks 40 --only q_dtypes=bfloat16 --only head_dims=128 --only window_left=false
campaign flex-families 35 --only q_dtypes=bfloat16 --only head_dims=64,576
campaign sglang-decode-mla 25 --only q_dtypes=bfloat16
campaign sglang-extend-mla 25 --only q_dtypes=bfloat16
campaign flashinfer-mla-fa3 25 --only q_dtypes=bfloat16 --only kv_dtypes=
cat "$L/campaigns.log"
python3 - "$T" "$L" <<'PY'
import json, shutil, sys
from pathlib import Path
tmp, logs = Path(sys.argv[1]), Path(sys.argv[2])
summary = {}
for path in sorted(tmp.glob("*.json")):
    try:
        rows = json.loads(path.read_text() or "[]")
    except json.JSONDecodeError:
        print(f"== {path.stem}: no JSON summary; stderr tail:\n{(tmp / (path.stem + '.err')).read_text()[-800:]}")
        continue
    for r in rows:
        counts = r.get("coverage", {}).get("counts", {})
        options = {k: sorted(v) for k, v in counts.items() if k in ("causal", "window", "sinks", "logits_soft_cap", "head_dim", "kv_dtype", "page_size", "group_size", "fp8_scales")}
        finding = r.get("finding") or {}
        print(f"== {r['backend']}: {r['status']}, {r['examples']} examples, {r.get('passed')} passed, "
              f"{r.get('unsupported')} unsupported, worst ratio {r.get('worst_ratio')}, {r.get('seconds')} s")
        print(f"   options covered: {options}")
        if finding:
            print(f"   FINDING: {json.dumps(finding)[:700]}")
        summary[r["backend"]] = {k: r.get(k) for k in ("status", "examples", "passed", "unsupported", "worst_ratio", "seconds")} | {"options": options, "finding": finding}
(logs / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
copied = 0
for d in sorted(tmp.iterdir()):  # the first finding of each backend, flat ($OUT/families/finding-NAME.json), 4 at most
    cases = sorted(d.rglob("case.json")) if d.is_dir() else []
    if cases and copied < 4:
        shutil.copy(cases[0], logs / f"finding-{d.name}.json")
        copied += 1
PY
