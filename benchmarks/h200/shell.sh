#!/usr/bin/env bash
# helper "shell" (issue 11): the lazy CLI, `pa-oracle env` and the campaign progress on the GPU box.
# Prints PASS/FAIL per check; logs in $OUT/shell/. Expected total: ~2 minutes.
set -u
LOG="${OUT:-/tmp/out}/shell"; mkdir -p "$LOG"
fail=0
check() { if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; fail=1; fi; }

# 1. --help is fast and imports no torch (also with CUDA torch, FlashInfer, SGLang installed)
start=$(date +%s.%N); python -m pa_oracle --help > "$LOG/help.txt" 2>&1; end=$(date +%s.%N)
secs=$(python -c "print(round($end - $start, 2))"); echo "pa-oracle --help: ${secs}s"
check "help under 1 s" "python -c 'import sys; sys.exit(0 if $secs < 1.0 else 1)'"
check "help imports no torch" "python -c 'import sys, pa_oracle.cli; sys.exit(1 if \"torch\" in sys.modules else 0)'"

# 2. env: a table with the GPU, each kernel library's version, the caches, the golden corpus
python -m pa_oracle env > "$LOG/env.txt" 2>&1; rc=$?
python -m pa_oracle env --json > "$LOG/env.json" 2>"$LOG/env-json.err"
cat "$LOG/env.txt"
check "env exits 0" "[ $rc -eq 0 ]"
check "env names the GPU" "grep -q 'H200' '$LOG/env.txt'"
check "env shows FlashInfer's version" "python -c 'import json,sys; d=json.load(open(\"$LOG/env.json\")); sys.exit(0 if \"version\" in d[\"libraries\"][\"flashinfer\"] else 1)'"
check "env shows the FlashInfer JIT cache" "grep -q 'FlashInfer JIT' '$LOG/env.txt'"

# 3. progress: a FlashInfer campaign in a log (not a TTY) beats every 5 s during its compile
timeout 170 python -m pa_oracle fuzz -b flashinfer-decode -n 30 --out /tmp/shell-out > "$LOG/fuzz.out" 2> "$LOG/fuzz.err"; rc=$?
tail -5 "$LOG/fuzz.err"
check "fuzz exits 0 or 1" "[ $rc -eq 0 ] || [ $rc -eq 1 ]"
check "heartbeat lines with phase and rate" "grep -Eq '\.\.\. flashinfer-decode: (first case|judging).*cases judged, [0-9.]+/s' '$LOG/fuzz.err'"
exit $fail
