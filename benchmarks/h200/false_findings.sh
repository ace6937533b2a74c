#!/usr/bin/env bash
# issue 30: a false-finding sweep with the operand-rounding bound (oracle/tolerance.py): FlashInfer's RoPE adapters
# and the other FlashInfer / flex adapters at seeds 0, 1, 2, tiny cases weighted up (--max-batch 3 --max-kv-len 24:
# the one- and two-key rows where a control's lucky rounding used to set the limit).
# Needs FlashInfer installed (/work/shared/device/README.md, the `flashinfer` set) and the checkout as cwd.
# Prints one table: backend x seed -> cases judged / failures (a finding stops that backend's campaign, so 0 or 1),
# and each failure's first line. Success: 0 failures outside the ledger (a known one is skipped by --skip-known).
# Wall time <= ~6 min: each seed's campaign has a 100 s --time-budget (compiles within 30% of it; the RoPE modules
# built at seed 0 are reused by seeds 1 and 2) inside a 115 s timeout. Logs: $OUT/false_findings/.
set -u
L="$OUT/false_findings"; mkdir -p "$L"
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-16}
export PYTHONPATH="${PYTHONPATH:-}:$PWD"
BACKENDS=(flashinfer-prefill-fa2-rope flashinfer-decode-rope flashinfer-decode-tc-rope
          flashinfer-decode flashinfer-decode-tc flashinfer-prefill-fa2 flashinfer-prefill-fa3 flashinfer-ragged-fa2
          flashinfer-prefill-fa3-fp8 flex)
ARGS=()
for b in "${BACKENDS[@]}"; do ARGS+=(-b "$b"); done
BUDGET=${SWEEP_SECONDS:-100}
for seed in 0 1 2; do
  start=$(date +%s)
  timeout $(( BUDGET + 15 )) python3 -m pa_oracle fuzz "${ARGS[@]}" --seed "$seed" -n 100000 --time-budget "$BUDGET" \
    --max-batch 3 --max-kv-len 24 --json --out "$L/seed$seed" > "$L/seed$seed.json" 2> "$L/seed$seed.err"
  echo "seed $seed: rc=$? after $(( $(date +%s) - start )) s; stderr tail: $(tail -c 200 "$L/seed$seed.err" | tr '\n' ' ')"
done
python3 - "$L" "${BACKENDS[@]}" <<'PY'
import json, pathlib, sys
folder, backends = pathlib.Path(sys.argv[1]), sys.argv[2:]
table, notes = {}, []
for seed in (0, 1, 2):
    text = (folder / f"seed{seed}.json").read_text() if (folder / f"seed{seed}.json").exists() else ""
    rows = json.loads(text[text.index("["):]) if "[" in text else []
    for r in rows:
        finding = r.get("finding")
        judged = (r.get("passed") or 0) + (1 if finding else 0)  # drawn examples less unsupported and known ones
        table[r["backend"], seed] = (judged, 1 if finding else 0, r.get("status"))
        if finding:
            notes.append(f"seed {seed} {r['backend']}: {finding.get('case')}: {str(finding.get('message'))[:300]}")
print(f"{'backend':32s}" + "".join(f"{'seed ' + str(s):>18s}" for s in (0, 1, 2)) + f"{'total':>16s}")
totals = [0, 0]
for b in backends:
    cells, judged, failed = [], 0, 0
    for s in (0, 1, 2):
        n, f, status = table.get((b, s), (0, 0, "absent"))
        judged, failed = judged + n, failed + f
        cells.append(f"{n:>7d} / {f}" + ("" if status in ("done", "finding", None) else f" {status}"[:9]))
    totals = [totals[0] + judged, totals[1] + failed]
    print(f"{b:32s}" + "".join(f"{c:>18s}" for c in cells) + f"{judged:>10d} / {failed}")
print(f"{'all':32s}{'':54s}{totals[0]:>10d} / {totals[1]}   (cases judged / failures)")
for n in notes:
    print("FAIL", n)
PY
