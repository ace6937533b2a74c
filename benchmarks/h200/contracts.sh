#!/usr/bin/env bash
# issue 13, helper "contracts": replay the golden corpus (--json) on the installed FlashInfer + flash-attn
# (+ SGLang when it imports), one backend at a time under its own time limit, merged into one record
# $OUT/contracts/replay-flashinfer-<version>.json (the input of `pa-oracle replay-compare A.json B.json`).
# Success: the flash-attn causal-ALiBi cases (flash-attn-kvcache-alibi-lse, -paged-alibi-lse) PASS on
# every flash-attn backend that runs them (the per-row LSE shift is converted); flashinfer-decode-alibi-soft-cap
# runs (not "unsupported") on flashinfer-decode/-tc in FlashInfer's order and is "known" on 0.6.18.post1;
# no line starts with ">>>" except "FIXED in ..." lines on a newer FlashInfer (a ">>>" finding/unexpected pass
# is what this run is for: it is printed, not hidden). Backends run in the order of WANT (flash-attn first:
# no compiles); one not reached in CONTRACTS_SECONDS (default 225) is logged "out of time" (raise it for the
# whole corpus on every backend; CONTRACTS_BACKENDS="a b" picks backends).
set -u
L="$OUT/contracts"; T=/tmp/contracts; mkdir -p "$L" "$T"
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-16}
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
FI=$(python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null || echo none)
echo "flashinfer $FI, flash_attn $(python3 -c 'import flash_attn; print(flash_attn.__version__)' 2>/dev/null || echo none)"
WANT="${CONTRACTS_BACKENDS:-flash-attn-kvcache flash-attn-kvcache-split4 flash-attn-kvcache-paged flash-attn-varlen flashinfer-decode-tc flashinfer-decode flashinfer-prefill-fa2 flashinfer-ragged-fa2 flashinfer-prefill-fa3 flashinfer-decode-hnd flashinfer-prefill-fa2-hnd flashinfer-cascade sglang-decode sglang-decode-split8 sglang-extend}"
BUDGET=${CONTRACTS_SECONDS:-225}  # the whole replay; FlashInfer compiles each new variant (~12 s decode, ~60 s prefill)
NAMES=$(python3 - $WANT <<'PY'
import sys
from pa_oracle.backends import available
usable, missing = available()
names = {b.name for b in usable}
for n in sys.argv[1:]:
    if n not in names:
        print(f"not available: {n}: {missing.get(n, 'unknown')[:120]}", file=sys.stderr)
print(" ".join(n for n in sys.argv[1:] if n in names))
PY
)
START=$(date +%s)
for b in $NAMES; do
  left=$(( BUDGET - ($(date +%s) - START) ))
  if [ $left -lt 15 ]; then echo "out of time: $b not replayed" | tee -a "$L/replay.log"; continue; fi
  limit=$(( left < 75 ? left : 75 ))
  timeout $limit python3 -m pa_oracle replay golden/cases -b "$b" --json --output "$T/$b.json" > /dev/null 2>> "$L/replay.log"
  rc=$?; echo "$b: rc=$rc ($(( $(date +%s) - START )) s)" | tee -a "$L/replay.log"
done
python3 - "$T" "$L/replay-flashinfer-$FI.json" <<'PY'
import json, sys
from pathlib import Path
docs = [json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*.json"))]
if not docs:
    sys.exit("no replay record was written")
merged = dict(docs[0]); merged["results"] = [r for d in docs for r in d["results"]]
merged["environment"] = dict(docs[0]["environment"], packages={k: v for d in docs for k, v in d["environment"]["packages"].items()})
Path(sys.argv[2]).write_text(json.dumps(merged, indent=1) + "\n")
rows = merged["results"]
focus = ("flash-attn-kvcache-alibi-lse", "flash-attn-kvcache-paged-alibi-lse", "flashinfer-decode-alibi-soft-cap")
print("== the converted conventions and the order")
for r in rows:
    if r["case"] in focus and r["status"] != "unsupported":
        print(f"  {r['case']} on {r['backend']}: {r['status']} / {r['ledger']}: {r['message'][:110]}")
print("== loud lines (finding, unexpected pass, error, fixed)")
for r in rows:
    if r["ledger"] in ("finding", "unexpected-pass", "error", "fixed"):
        print(f"  >>> {r['case']} on {r['backend']}: {r['status']} / {r['ledger']}: {r['ledger_message'][:160]} | {r['message'][:120]}")
kinds = [r["ledger"] for r in rows]
print("== totals:", {k: kinds.count(k) for k in sorted(set(kinds))}, "records", len(rows))
PY
