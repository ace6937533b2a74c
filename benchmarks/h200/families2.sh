#!/usr/bin/env bash
# issue 14, helper "families" (second round): what the first round left open, on the H200.
#  1. mask-replan (FlashInfer PR #1028 class) on the real wrappers: flashinfer-ragged-mask (0.6.18's ragged plan never
#     clears _custom_mask_buf: issue #860 / open PR #2690) and flashinfer-prefill-mask-replan (paged: cleared).
#  2. flashinfer-mla-fa3: `warmup` builds one MLA module ahead, then a campaign with a 1 s compile budget draws inside it.
#  3. sglang-decode-mla / sglang-extend-mla: first GPU campaigns.
#  4. flashinfer-prefill-packed-mask: the packed_custom_mask + element mask_indptr lead (PR #2201), batches > 1.
#  5. the golden corpus on the new flashinfer-ragged-mask adapter, against the ledger (what tests/test_golden.py runs).
# Prints per campaign: status, examples, passed/held, worst error ratio, finding/violation (first 600 chars).
# Success: (1) ragged: a violation whose message starts "stale mask" (confirms #860 on this FlashInfer; if it holds,
#   this FlashInfer clears the buffer: say so), paged replan: held with 0 violations; (2) warmup prints "built 1 of 1",
#   the fa3 campaign judges > 0 examples with 0 compiles counted ("variants" line) and passes (worst ratio < 1);
#   (3) both SGLang MLA campaigns judge > 0 examples, pass, worst ratio < 1 (a finding is a lead to triage);
#   (4) a finding on a case with batch >= 2 and a mask (the lead confirmed) or a pass on single-request cases only;
#   (5) no "new finding" line; if flashinfer-prefill-mask-empty-row-lse fails there as a new finding (the same -5e4
#   sentinel), the ledger entry of that name needs "flashinfer-ragged-fa2" in its families (the ragged kernel).
# Wall time < 4 min: every step has its own timeout inside a global 230 s deadline. Logs: $OUT/families/ (<= 6 files).
set -u
L="$OUT/families"; T=/tmp/families2; mkdir -p "$L" "$T"
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-16}
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
START=$(date +%s); LOG="$L/campaigns.log"
step() {  # NAME SECONDS COMMAND...: run with a hard timeout inside the global deadline
  local name=$1 want=$2; shift 2
  local left=$(( ${FAMILIES_SECONDS:-230} - ($(date +%s) - START) ))
  if [ $left -lt 15 ]; then echo "$name: skipped (out of time)" | tee -a "$LOG"; return; fi
  [ $want -gt $(( left - 5 )) ] && want=$(( left - 5 ))
  timeout $want "$@" > "$T/$name.out" 2> "$T/$name.err"
  echo "$name: rc=$? after $(( $(date +%s) - START )) s (limit ${want} s); stderr: $(tail -c 240 "$T/$name.err" | tr '\n' ' ')" | tee -a "$LOG"
}
python3 - <<'PY' 2>&1 | tee -a "$LOG"
import inspect
import flashinfer, torch
from flashinfer.prefill import BatchPrefillWithPagedKVCacheWrapper as Paged, BatchPrefillWithRaggedKVCacheWrapper as Ragged
from pa_oracle.backends import get_backend
print(f"flashinfer {flashinfer.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
for cls in (Paged, Ragged):  # the PR #1028 fix: plan() resets the mask buffer when no mask is given
    print(f"{cls.__name__}.plan resets _custom_mask_buf: {'self._custom_mask_buf = None' in inspect.getsource(cls.plan)}")
for name in ("flashinfer-mla", "flashinfer-mla-fa3"):
    b = get_backend(name)
    keys = [(("q_dtype", q), ("kv_dtype", kv)) for q, kv in (("float16", "float16"), ("bfloat16", "bfloat16"), ("bfloat16", "float8_e4m3fn"))]
    print(name, {dict(k)["q_dtype"] + "/" + dict(k)["kv_dtype"]: b.built_reason(k) for k in keys})
try:
    import sglang
    print("sglang", getattr(sglang, "__version__", "?"))
except Exception as exc:  # noqa: BLE001
    print("sglang import failed:", type(exc).__name__, str(exc)[:200])
PY
PREBUILT=(--only q_dtypes=bfloat16 --only kv_dtypes= --only head_dims=64,128 --only window_left=false --only logits_soft_cap=false
          --only qo_len_above_kv_len=false)
step mask-replan 45 python3 -m pa_oracle metamorphic -b flashinfer-ragged-mask -b flashinfer-prefill-mask-replan -c mask-replan \
  -n 25 --time-budget 35 --json --out "$T/mask-replan" "${PREBUILT[@]}"
step golden-ragged 25 python3 -m pa_oracle replay golden/cases -b flashinfer-ragged-mask
step mla-fa3-warmup 80 python3 -m pa_oracle warmup -b flashinfer-mla-fa3 --variants 1
step mla-fa3 30 python3 -m pa_oracle fuzz -b flashinfer-mla-fa3 -n 200 --time-budget 20 --compile-budget 1 --json --out "$T/mla-fa3"
step sglang-mla 45 python3 -m pa_oracle fuzz -b sglang-decode-mla -b sglang-extend-mla -n 200 --time-budget 35 --json \
  --out "$T/sglang-mla" --only q_dtypes=bfloat16
step packed-mask 20 python3 -m pa_oracle fuzz -b flashinfer-prefill-packed-mask -n 100 --time-budget 14 --json \
  --out "$T/packed-mask" "${PREBUILT[@]}"
cat "$T/mla-fa3-warmup.out" | tee -a "$LOG"
tail -n 25 "$T/golden-ragged.out" | tee -a "$LOG"
python3 - "$T" "$L" <<'PY' | tee "$L/summary.txt"
import json, shutil, sys
from pathlib import Path
tmp, logs = Path(sys.argv[1]), Path(sys.argv[2])
for step in ("mask-replan", "mla-fa3", "sglang-mla", "packed-mask"):
    text = (tmp / f"{step}.out").read_text() if (tmp / f"{step}.out").exists() else ""
    try:
        rows = json.loads(text[text.index("["):]) if "[" in text else []
    except json.JSONDecodeError:
        print(f"== {step}: no JSON; stdout tail: {text[-400:]}")
        continue
    for r in rows:
        finding = r.get("finding") or r.get("violation") or {}
        print(f"== {step} {r['backend']} {r.get('check', 'oracle')}: {r['status']}, {r['examples']} examples, "
              f"passed/held {r.get('passed', r.get('held'))}, unsupported {r.get('unsupported', r.get('skipped'))}, "
              f"worst ratio {r.get('worst_ratio')}, {r.get('seconds')} s, notes {r.get('notes')}")
        if finding:
            print(f"   FINDING: {json.dumps(finding)[:600]}")
copied = 0
for d in sorted(p for p in tmp.iterdir() if p.is_dir()):  # the first saved case of each step, at most 3
    cases = sorted(d.rglob("case.json"))
    if cases and copied < 3:
        shutil.copy(cases[0], logs / f"finding-{d.name}.json")
        copied += 1
PY
grep -h "variants:" "$T"/*.err 2>/dev/null | head -4 | tee -a "$LOG"
echo "total $(( $(date +%s) - START )) s" | tee -a "$LOG"
