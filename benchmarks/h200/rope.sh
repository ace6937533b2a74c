#!/usr/bin/env bash
# issue 15, helper "rope": FlashInfer's in-kernel RoPE and head dims 256/512 on the H200 (FlashInfer 0.6.18.post1).
#  0. facts from the installed FlashInfer (signatures, pos_enc.cuh pairing, decode/prefill q positions, POD, fp8 q).
#  1. `pa-oracle warmup` builds, in parallel, three JIT modules the AOT wheel lacks: decode ROPE_LLAMA hd256,
#     fa2 prefill ROPE_LLAMA hd128 (posenc_1), CUDA-core decode hd512 (bf16, no window/soft cap).
#  2. a compile-budgeted campaign on each (drawn inside the built key: 1 s compile budget).
#  3. an in-process tally over 40 drawn cases per adapter: status and worst error ratio per RoPE option
#     (style, theta, rope_scale, causal, decode/prefill), so a wrong position or scale convention shows where.
# Success: warmup prints "built 1 of 1" three times; each campaign: status complete/ok, > 0 examples, 0 findings,
#   worst ratio < 1; the tally: every row "pass" (0 fail). A failure on every RoPE case = the oracle's RoPE
#   convention differs from FlashInfer's (positions / pairing / rope_scale): see the tally's rows; failures only at
#   large positions or one theta = a precision lead (FlashInfer uses __sincosf / __powf).
# Wall time < 4 min: every step has its own timeout inside a global 225 s deadline. Logs: $OUT/rope/ (<= 6 files).
set -u
L="$OUT/rope"; T=/tmp/rope-gpu; mkdir -p "$L" "$T"
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-16}
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
START=$(date +%s); LOG="$L/campaigns.log"
left() { echo $(( ${ROPE_SECONDS:-225} - ($(date +%s) - START) )); }
step() {  # NAME SECONDS COMMAND...: run with a hard timeout inside the global deadline
  local name=$1 want=$2; shift 2
  local l=$(left)
  if [ $l -lt 15 ]; then echo "$name: skipped (out of time)" | tee -a "$LOG"; return; fi
  [ $want -gt $(( l - 5 )) ] && want=$(( l - 5 ))
  timeout $want "$@" > "$T/$name.out" 2> "$T/$name.err"
  echo "$name: rc=$? after $(( $(date +%s) - START )) s (limit ${want} s); stderr: $(tail -c 240 "$T/$name.err" | tr '\n' ' ')" | tee -a "$LOG"
}
COMMON=(--only q_dtypes=bfloat16 --only kv_dtypes= --only window_left=false --only logits_soft_cap=false)
DEC_ROPE=(-b flashinfer-decode-rope "${COMMON[@]}" --only head_dims=256)
PRE_ROPE=(-b flashinfer-prefill-fa2-rope "${COMMON[@]}" --only head_dims=128)
DEC_512=(-b flashinfer-decode "${COMMON[@]}" --only head_dims=512 --only alibi=false)

python3 - <<'PY' 2>&1 | tee -a "$LOG"
import inspect, pathlib
import flashinfer, torch
from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper as Decode
from flashinfer.prefill import BatchPrefillWithPagedKVCacheWrapper as Prefill
print(f"flashinfer {flashinfer.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
for cls in (Decode, Prefill):
    params = inspect.signature(cls.plan).parameters
    print(f"{cls.__name__}.plan takes rope_scale/rope_theta/pos_encoding_mode: {all(p in params for p in ('rope_scale', 'rope_theta', 'pos_encoding_mode'))}")
print("Prefill.run takes q_scale (fp8 q):", "q_scale" in inspect.signature(Prefill.run).parameters)
print("POD wrappers:", [n for n in ("PODWithPagedKVCacheWrapper", "BatchPODWithPagedKVCacheWrapper") if hasattr(flashinfer, n)])
inc = pathlib.Path(flashinfer.__file__).parent / "data" / "include" / "flashinfer"
pos, dec, pre = ((inc / p).read_text() if (inc / p).exists() else "" for p in ("pos_enc.cuh", "attention/decode.cuh", "attention/prefill.cuh"))
print("pos_enc.cuh pairs d with d +- rotary_dim/2 (neox halves):", "threadIdx.x * vec_size + rotary_dim / 2" in pos)
print("decode.cuh q at kv_len - 1:", "(kv_len - 1)" in dec, "| prefill.cuh q at i + kv_len - qo_len:", "kv_len * group_size - qo_len * group_size" in pre)
from pa_oracle.backends import get_backend
for name in ("flashinfer-decode-rope", "flashinfer-prefill-fa2-rope"):
    b = get_backend(name)
    print(name, "compile fields", b.compile_fields)
PY

# 1. three modules in parallel (each its own ninja run, MAX_JOBS jobs each)
for spec in DEC_ROPE PRE_ROPE DEC_512; do
  unset -n args; declare -n args=$spec
  ( timeout 130 python3 -m pa_oracle warmup "${args[@]}" --variants 1 > "$T/warm-$spec.out" 2>&1; echo "rc=$?" >> "$T/warm-$spec.out" ) &
done
wait
for spec in DEC_ROPE PRE_ROPE DEC_512; do echo "== warmup $spec after $(( $(date +%s) - START )) s:"; tail -n 4 "$T/warm-$spec.out"; done | tee -a "$LOG"

# 2. campaigns inside the built keys
step decode-rope 40 python3 -m pa_oracle fuzz "${DEC_ROPE[@]}" -n 400 --time-budget 30 --compile-budget 1 --json --out "$T/decode-rope"
step prefill-rope 40 python3 -m pa_oracle fuzz "${PRE_ROPE[@]}" -n 400 --time-budget 30 --compile-budget 1 --json --out "$T/prefill-rope"
step decode-512 35 python3 -m pa_oracle fuzz "${DEC_512[@]}" -n 300 --time-budget 25 --compile-budget 1 --json --out "$T/decode-512"

# 3. per-option tally (in process; the modules are built by now)
step tally 40 python3 - <<'PY'
import collections
from hypothesis import HealthCheck, Phase, given, seed, settings
from pa_oracle.backends import get_backend
from pa_oracle.fuzz.cli import narrow
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.run.runner import check_case
common = ("q_dtypes=bfloat16", "kv_dtypes=", "window_left=false", "logits_soft_cap=false")
for name, dims in (("flashinfer-decode-rope", "256"), ("flashinfer-prefill-fa2-rope", "128")):
    backend = narrow(get_backend(name), (*common, f"head_dims={dims}"))
    drawn = []
    @seed(15)
    @settings(max_examples=40, database=None, deadline=None, phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(cases(backend.capabilities, Limits()))
    def take(case):
        drawn.append(case)
    take()
    rows = collections.defaultdict(lambda: [0, 0, 0.0])  # pass, fail, worst ratio
    for case in drawn:
        r = case.options.rope
        o = check_case(backend, case)
        ratio = o.verdict.out.ratio if o.verdict is not None and o.verdict.out is not None else float("nan")
        key = (r.style, f"theta={r.theta:g}", f"scale={r.scale:g}", f"causal={case.options.causal}",
               "decode" if max(case.layout.qo_lens) <= 1 else "prefill", f"max_kv={max(case.layout.kv_lens)}" if o.status != "pass" else "")
        row = rows[key]
        row[0 if o.status == "pass" else 1] += 1
        row[2] = max(row[2], ratio)
        if o.status not in ("pass", "unsupported"):
            print(f"  {name} {o.status}: {case.summary()} :: {o.message[:300]}")
    print(f"== tally {name}: {len(drawn)} cases")
    for key, (ok, bad, worst) in sorted(rows.items()):
        print(f"   {' '.join(k for k in key if k):70s} pass {ok:3d} fail {bad:3d} worst ratio {worst:.3f}")
PY
cat "$T/tally.out" | tee -a "$LOG"

python3 - "$T" "$L" <<'PY' | tee "$L/summary.txt"
import json, shutil, sys
from pathlib import Path
tmp, logs = Path(sys.argv[1]), Path(sys.argv[2])
for step in ("decode-rope", "prefill-rope", "decode-512"):
    text = (tmp / f"{step}.out").read_text() if (tmp / f"{step}.out").exists() else ""
    try:
        rows = json.loads(text[text.index("["):]) if "[" in text else []
    except json.JSONDecodeError:
        print(f"== {step}: no JSON; stdout tail: {text[-400:]}")
        continue
    if not rows:
        print(f"== {step}: no result; stderr tail: {(tmp / f'{step}.err').read_text()[-400:] if (tmp / f'{step}.err').exists() else ''}")
    for r in rows:
        cov = r.get("coverage") or {}
        print(f"== {step} {r['backend']}: {r['status']}, {r['examples']} examples, passed {r['passed']}, "
              f"unsupported {r['unsupported']}, worst ratio {r['worst_ratio']}, {r['seconds']} s, notes {r['notes']}")
        print(f"   coverage: {json.dumps(cov)[:700]}")
        if r.get("finding"):
            print(f"   FINDING: {json.dumps(r['finding'])[:700]}")
copied = 0
for d in sorted(p for p in tmp.iterdir() if p.is_dir()):  # the first saved case of each campaign, at most 3
    found = sorted(d.rglob("case.json"))
    if found and copied < 3:
        shutil.copy(found[0], logs / f"finding-{d.name}.json")
        copied += 1
PY
echo "total $(( $(date +%s) - START )) s" | tee -a "$LOG"
