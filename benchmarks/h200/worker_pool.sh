# issue 12, session 13 (2026-12-03): several worker processes per device (pa_oracle.fuzz.run.pool).
# FlashInfer 0.6.18.post1 with its prebuilt sm90 kernels and a msgspec wheel in /tmp/site (../shared/device/README.md).
# Success: the same cases with one worker process and two (seen lists equal), and a warm campaign judging >= 150
# cases a second per backend with two.
# Steps: bash worker_pool.sh same | warm BUDGET "2 1" | cold [BUDGET]
export PYTHONPATH=/tmp/site:$PWD FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
D=$OUT/worker_pool; mkdir -p $D /tmp/caches
export TRITON_CACHE_DIR=/tmp/caches/triton_cache_dir TORCHINDUCTOR_CACHE_DIR=/tmp/caches/torchinductor_cache_dir \
  FLASHINFER_WORKSPACE_BASE=/tmp/caches/flashinfer_workspace_base  # as cold_campaign.py --caches /tmp/caches names them
B="-b flashinfer-decode -b flashinfer-decode-tc -b flashinfer-decode-hnd -b flashinfer-cascade -b flashinfer-prefill-fa2"
B="$B -b flashinfer-ragged-fa2 -b vllm-flashinfer -b sdpa-efficient"
case "$1" in
same)  # 500 decode-tc examples inside the prebuilt variants, one worker process against two: the same cases
  for p in 1 2; do
    PA_ORACLE_WORKER_PROCESSES=$p timeout 200 python3 -m pa_oracle fuzz -b flashinfer-decode-tc -n 500 --seed 5 \
      --compile-budget 0.001 --out /tmp/same$p --overwrite > $D/same$p.txt 2>&1; echo "worker processes $p: rc=$?"
  done
  python3 - <<'PY'
import json
a, b = (json.load(open(f"/tmp/same{p}/campaign.json"))["backends"] for p in (1, 2))
for key in a:
    x, y = a[key], b[key]
    print(key, "same cases in the same order:", x["seen"] == y["seen"], len(x["seen"]), "drawn;",
          {k: (x[k], y[k]) for k in ("examples", "passed", "skipped_known", "status")})
PY
  ;;
warm)  # warm the caches (40 s), then a BUDGET s campaign of eight backends with each worker process count
  timeout 120 python3 benchmarks/cold_campaign.py --time-budget 40 --caches /tmp/caches $B | head -1
  for p in ${3:-2 1}; do
    echo "== PA_ORACLE_WORKER_PROCESSES=$p"
    PA_ORACLE_WORKER_PROCESSES=$p timeout $((${2:-120} + 60)) python3 benchmarks/cold_campaign.py --time-budget ${2:-120} \
      --caches /tmp/caches --log $D/warm$p.log $B
    grep "drawn ahead" $D/warm$p.log
  done
  ;;
cold)  # the main job's 12 backends with fresh caches and the default worker and draw processes, BUDGET s (default 300)
  timeout 420 python3 benchmarks/cold_campaign.py --time-budget ${2:-300} --log $D/cold.log $B \
    -b flashinfer-prefill-fa2-hnd -b flashinfer-prefill-fa3 -b sdpa-math -b flex
  grep "drawn ahead" $D/cold.log
  ;;
esac
