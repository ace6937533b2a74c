#!/bin/bash
# The hand-written POD repro (golden/reports/flashinfer-pod-decode-tile-16/repro.py) on the GPU.
# Expect exit 1: REPRODUCED on its three group-32 cases (qo heads 16..31 of each decode row, 48..63 too with 2 KV
# heads), "ok" on the group-16 control, the standalone fa2 prefill wrong on none. 0 = not reproduced, 3 = wrong
# otherwise, 2 = could not run. The first run JIT-builds the POD module (~2 min) unless the cache is warm.
set -u
mkdir -p "$OUT/pod"
python -c "import flashinfer, torch; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__)" > "$OUT/pod/versions.txt" 2>&1
timeout 230 python golden/reports/flashinfer-pod-decode-tile-16/repro.py > "$OUT/pod/repro.log" 2>&1
echo "repro exit $?" >> "$OUT/pod/repro.log"
cat "$OUT/pod/versions.txt"; tail -40 "$OUT/pod/repro.log"
