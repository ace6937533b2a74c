# 2026-12-05, third device call (issue 32, after every helper's change): carry .device/trees (new.tgz = HEAD),
# FlashInfer's wheels and AOT kernels, .device/extra. The GPU tests the backends' typing touched
# (benchmarks/h200/issue32_backend_types.sh's pytest part, capped), then the main job briefly on empty caches.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a
mkdir -p /tmp/new && tar xzf .device/trees/new.tgz -C /tmp/new
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/flashinfer/*.whl \
  .device/extra/*.whl && tar xzf .device/flashinfer/*-aot-*.tgz -C /tmp/site/flashinfer/data/ || echo "install failed"
cd /tmp/new && export PYTHONPATH=/tmp/site:$PWD
timeout 170 python3 -m pytest -q -p no:xdist -x tests/test_cuda_graphs.py tests/test_backends.py \
  tests/reliability/test_verdict_in_worker.py -k "flashinfer or graph or vllm or sdpa or verdict" 2>&1 | tail -8 | tee $OUT/gpu_tests.log
echo "== main job (HEAD, fresh caches, 120 s)"
timeout 220 python3 benchmarks/cold_campaign.py --time-budget 120 -n 300 --log "$OUT/main.log" 2>&1 | grep -v " variants: " | head -30
grep -E "^FINDING|pa-oracle:" "$OUT/main.log" | head -20
