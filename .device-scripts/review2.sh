#!/usr/bin/env bash
# review2: run the hand-written POD decode-tile repro (fixed unpacking of run()'s return) on the H200.
# Success: exit code 1, "-> REPRODUCED" on the first three cases and "-> ok" on "control: group 16".
# Before the fix every case printed "RuntimeError: shape mismatch" and it exited 2.
set -u
mkdir -p "$OUT/review2"
python -c "import flashinfer, torch; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__)" > "$OUT/review2/env.txt" 2>&1
timeout 230 python golden/reports/flashinfer-pod-decode-tile-16/repro.py > "$OUT/review2/repro.log" 2>&1
echo "exit $?" | tee -a "$OUT/review2/repro.log"
grep -E "^[a-z].*heads|->|Error" "$OUT/review2/repro.log" | tail -20
