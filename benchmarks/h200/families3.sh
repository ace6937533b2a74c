#!/usr/bin/env bash
# issue 14, session 10: campaigns of every attention-family adapter on the H200, now that each names its compile keys.
#  1. SGLang (Triton): extend, extend-mask, extend-mla (16-bit KV), then decode, decode-mla and flex-families.
#  2. FlashInfer: the masked prefill adapters inside the prebuilt modules, the mask-replan check, then the sink and
#     MLA wrappers (their JIT modules built within the campaign's compile budget, one key each).
# Prints per backend: status, examples, passed, unsupported, skipped as known, worst error ratio, start/compile/judge.
# Success: each campaign judges >= 100 cases or ends in a finding; a finding is triaged before it enters the ledger.
# Needs SGLang (1) or FlashInfer (2) importable; FAMILIES=sglang or FAMILIES=flashinfer picks one (default: both).
# Logs: $OUT/families3/. About 4 minutes per part.
set -u
L="$OUT/families3"; mkdir -p "$L"
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-16}
summary() {  # JSON_FILE: one line per backend
  python3 - "$1" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
rows = json.loads(text[text.index("["):]) if "[" in text else []
for r in rows:
    print(f"{r['backend']}: {r['status']}, {r['examples']} examples, {r.get('passed')} passed, {r.get('unsupported')} unsupported, "
          f"{r.get('skipped_known')} known, worst ratio {r.get('worst_ratio')}, start/compile/judge "
          f"{r.get('start_seconds')}/{r.get('compile_seconds')}/{r.get('judge_seconds')} s")
    if r.get("finding"):
        print(f"  FINDING: {r['finding'].get('case')}: {r['finding'].get('message')}")
PY
}
if [ "${FAMILIES:-both}" != flashinfer ]; then
  timeout 290 python3 -m pa_oracle fuzz -b sglang-extend-mask -b sglang-extend -b sglang-extend-mla -n 100000 --time-budget 250 \
    --only kv_dtypes= --json --out "$L/sglang-extend" > "$L/sglang-extend.json" 2> "$L/sglang-extend.err"
  summary "$L/sglang-extend.json"
  timeout 200 python3 -m pa_oracle fuzz -b sglang-decode -b sglang-decode-mla -b flex-families -n 100000 --time-budget 165 \
    --json --out "$L/sglang-decode" > "$L/sglang-decode.json" 2> "$L/sglang-decode.err"
  summary "$L/sglang-decode.json"
fi
if [ "${FAMILIES:-both}" != sglang ]; then
  PREBUILT=(--only q_dtypes=bfloat16 --only kv_dtypes= --only head_dims=64,128 --only window_left=false --only logits_soft_cap=false)
  timeout 150 python3 -m pa_oracle fuzz -b flashinfer-prefill-mask -b flashinfer-prefill-packed-mask -b flashinfer-ragged-mask \
    -n 100000 --time-budget 120 --compile-budget 1 "${PREBUILT[@]}" --json --out "$L/mask" > "$L/mask.json" 2> "$L/mask.err"
  summary "$L/mask.json"
  timeout 60 python3 -m pa_oracle metamorphic -b flashinfer-prefill-mask-replan -b flashinfer-ragged-mask -c mask-replan -n 2000 \
    --time-budget 45 "${PREBUILT[@]}" --json --out "$L/replan" > "$L/replan.json" 2> "$L/replan.err"
  tail -c 1500 "$L/replan.json"
  timeout 200 python3 -m pa_oracle fuzz -b flashinfer-sinks -b flashinfer-mla -b flashinfer-mla-fa3 -n 100000 --time-budget 175 \
    --compile-budget 1 --only q_dtypes=bfloat16 --json --out "$L/sinks-mla" > "$L/sinks-mla.json" 2> "$L/sinks-mla.err"
  summary "$L/sinks-mla.json"
fi
