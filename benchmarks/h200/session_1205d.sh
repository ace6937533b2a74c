# 2026-12-05, fourth session, after the merges (issues 32, 34): one warm machine, two calls.
#   PART=a, carry .device/trees (new.tgz = `git archive HEAD`), .device/flashinfer, .device/extra: the GPU tests of
#     FlashInfer/sdpa/graphs/verdict (the cascade test reads a ledger-covered drawn case as an xfail now), write kernels
#     through the campaign engine (FlashInfer's append, fp8 and not, torch-scatter), the main job 60 s on empty caches.
#   PART=b, carry .device/trees, .device/flash-attn, .device/triton, .device/extra: flash-attn 2 (GPU tests, the golden
#     corpus replayed on its adapters, a 45 s campaign, its append as a write kernel) and SGLang's two fp8 writes.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
rm -rf /tmp/new && mkdir -p /tmp/new && tar xzf .device/trees/new.tgz -C /tmp/new
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$@" 2>&1 | grep -v WARNING; }
if [ "${PART:-a}" = a ]; then
  pipi .device/flashinfer/*.whl .device/extra/*.whl; tar xzf .device/flashinfer/*-aot-*.tgz -C /tmp/site/flashinfer/data/
  cd /tmp/new && export PYTHONPATH=/tmp/site:$PWD
  nvidia-smi --query-gpu=name --format=csv,noheader
  echo "== GPU tests"; timeout 170 python3 -m pytest -q -p no:xdist tests/test_cuda_graphs.py tests/test_backends.py \
    tests/reliability/test_verdict_in_worker.py tests/test_judge.py tests/test_float32_logit_noise.py -k "flashinfer or graph or sdpa or verdict or judge or float32" 2>&1 | tail -6
  echo "== writes (engine)"; timeout 100 python3 -m pa_oracle writes -b flashinfer-append -b flashinfer-append-fp8 -b torch-scatter \
    -n 500 --time-budget 60 --out $OUT/writes 2>&1 | tail -8; echo "exit ${PIPESTATUS[0]}"
  echo "== main job 60 s, empty caches"; timeout 170 python3 benchmarks/cold_campaign.py --time-budget 60 -n 300 \
    --log "$OUT/main.log" 2>&1 | grep -v " variants: " | head -34
  grep -E "^FINDING|pa-oracle:" "$OUT/main.log" | head -10
else
  pipi .device/flash-attn/*.whl .device/triton/*.whl .device/extra/*.whl
  cd /tmp/new && export PYTHONPATH=/tmp/site:$PWD
  FA="-b flash-attn-kvcache -b flash-attn-kvcache-paged -b flash-attn-kvcache-split4 -b flash-attn-varlen"
  echo "== flash-attn GPU tests"; timeout 120 python3 -m pytest -q -p no:xdist tests/test_backends.py -k "flash_attn or flash-attn" 2>&1 | tail -4
  echo "== golden replay"; timeout 70 python3 -m pa_oracle replay golden/cases $FA 2>&1 | tail -16; echo "exit ${PIPESTATUS[0]}"
  echo "== flash-attn campaign 30 s"; timeout 110 python3 -m pa_oracle fuzz $FA --time-budget 30 --out $OUT/fa 2>&1 \
    | grep -vE " variants: |^  \.\.\." | tail -10; echo "exit ${PIPESTATUS[0]}"
  echo "== writes (engine): flash-attn append, SGLang fp8"; timeout 100 python3 -m pa_oracle writes -b flash-attn-kvcache-append \
    -b sglang-fp8-set-kv -b sglang-fp8-set-kv-torch -n 500 --time-budget 60 --out $OUT/writes 2>&1 | tail -8; echo "exit ${PIPESTATUS[0]}"
fi
