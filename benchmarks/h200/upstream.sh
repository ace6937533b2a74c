#!/usr/bin/env bash
# Upstream reports on the H200: run every golden/reports/*/repro.py whose kernel library is installed,
# with this project NOT importable (PYTHONPATH=/tmp/site only, and a meta-path guard that refuses
# pa_oracle), then replay the two new flash-attn cases through the adapters.
#
# Staged sets it installs when they were sent along (one 64 MiB send cannot hold all of them):
#   run A: .device/padeps .device/flashinfer              -> the FlashInfer report
#   run B: .device/padeps .device/flash-attn .device/triton -> the flash-attn and SGLang reports + replays
# Each run prints, per report, "NAME rc=N" (1: reproduces, 0: does not, 2: could not run) into
# $OUT/upstream/summary.txt and the repro's output into $OUT/upstream/<lib>.txt.
# Success: every report whose library is present exits 1; the replays: kvcache and kvcache-split4 FAIL (rc 1),
# varlen CRASHES (rc 1). Seen 2026-12-01: run B 119 s (5 repros rc=1, replays rc=1).
set -u
log="$OUT/upstream"; mkdir -p "$log"
site=/tmp/site
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$@" 2>&1 | tail -2; }
[ -d .device/padeps ] && pipi .device/padeps/*.whl
if [ -d .device/flashinfer ]; then
  pipi .device/flashinfer/*.whl && tar xzf .device/flashinfer/*-aot-*.tgz -C "$site/flashinfer/data/"
  export FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
fi
[ -d .device/flash-attn ] && pipi .device/flash-attn/*.whl
[ -d .device/triton ] && pipi .device/triton/*.whl

guard="$PWD/benchmarks/h200/without_project.py"
summary="$log/summary.txt"
has() { PYTHONPATH="$site" python3 -c "import $1" >/dev/null 2>&1; }
for dir in golden/reports/*/; do
  name=$(basename "$dir")
  lib=$(sed -n 's/^Standalone reproducer: needs only torch, numpy and \([a-z_]*\)\..*/\1/p' "$dir/repro.py")
  if ! has "$lib"; then echo "$name skipped ($lib not installed in this run)" >> "$summary"; continue; fi
  out="$log/$lib.txt"
  echo "=== $name" >> "$out"
  start=$(date +%s)
  (cd "$dir" && PYTHONPATH="$site" timeout 300 python3 "$guard" repro.py) >> "$out" 2>&1
  rc=$?
  echo "$name rc=$rc ($(( $(date +%s) - start )) s)" | tee -a "$summary" >> "$out"
done

if has flash_attn; then  # the two new cases through the adapters (the project installed; run outside the checkout
  root=$PWD             # so that its pa_oracle/ folder does not shadow the installed package)
  PYTHONPATH="$site" python3 -m pip install -q --no-deps --no-build-isolation -e . > "$log/install.txt" 2>&1
  for pair in "flash-attn-window-right-bound-qo-above-kv flash-attn-kvcache" \
              "flash-attn-window-right-bound-qo-above-kv flash-attn-kvcache-split4" \
              "flash-attn-varlen-gqa-decode-empty-query flash-attn-varlen"; do
    set -- $pair
    echo "=== replay $1 -b $2" >> "$log/replay.txt"
    (cd /tmp && PYTHONPATH="$site" timeout 120 python3 -m pa_oracle replay "$root/golden/cases/$1.json" -b "$2") >> "$log/replay.txt" 2>&1
    echo "replay $1 -b $2 rc=$?" | tee -a "$summary" >> "$log/replay.txt"
  done
fi
cat "$summary"
