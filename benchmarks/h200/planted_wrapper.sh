# Issue 40, the fuzz half on its own (one call, the flashinfer set): FlashInfer's real decode behind a wrapper that
# passes kv_last_page_len one short past the first page must be caught; the same wrapper without the mistake must pass.
#   carry .device/flashinfer;  bash benchmarks/h200/planted_wrapper.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/flashinfer/*.whl 2>&1 | grep -v WARNING
tar xzf .device/flashinfer/*-aot-*.tgz -C /tmp/site/flashinfer/data/ || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
M=pa_oracle.fuzz.quality.planted_wrappers
python3 -m pytest -q -p no:xdist -p no:cacheprovider tests/quality/test_planted_wrappers.py 2>&1 | tail -3 | tee $OUT/pytest.txt
for k in flashinfer_decode_short_last_page flashinfer_decode_wrapped; do
  t0=$SECONDS
  timeout 100 python3 -m pa_oracle fuzz --kernel $M:$k -n 300 --time-budget 45 --out /tmp/f-$k > $OUT/fuzz-$k.log 2>&1
  echo "fuzz $k exit $? in $((SECONDS - t0)) s" | tee -a $OUT/summary.txt
  grep -vE "^  \.\.\.| variants: " $OUT/fuzz-$k.log | tail -12
done
f=$(find /tmp/f-flashinfer_decode_short_last_page -name report.md | head -1); [ -n "$f" ] && cp "$f" $OUT/planted-report.md
