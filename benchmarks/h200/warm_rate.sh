# issue 12, session 14 (2026-12-03): where a warm campaign's time goes, and the warm rate per backend.
# FlashInfer 0.6.18.post1 with its prebuilt sm90 kernels and a msgspec wheel in /tmp/site (../shared/device/README.md).
# Success: every backend judges >= 150 cases a second while judging, warm, with the default worker and draw processes.
# Steps: bash warm_rate.sh shared | split BUDGET | warm BUDGET ["worker process counts"] | cold [BUDGET]
export PYTHONPATH=/tmp/site:$PWD FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
D=$OUT/warm_rate; mkdir -p $D /tmp/caches
B="-b flashinfer-decode -b flashinfer-decode-tc -b flashinfer-decode-hnd -b flashinfer-cascade -b flashinfer-prefill-fa2"
B="$B -b flashinfer-ragged-fa2 -b vllm-flashinfer -b sdpa-efficient"
case "$1" in
shared)  # cascade alone with fresh caches: its shared merge module built ahead (Backend.build_shared), counted as compiling
  timeout 150 python3 benchmarks/cold_campaign.py --time-budget 40 --log $D/shared.log -b flashinfer-cascade
  grep -i "merge\|shared\|compil" $D/shared.log | head -5
  ;;
split)  # warm the caches (30 s), then where the campaign process's time goes, BUDGET s over four backends
  timeout 120 python3 benchmarks/cold_campaign.py --time-budget 30 --caches /tmp/caches $B > /dev/null
  export TRITON_CACHE_DIR=/tmp/caches/triton_cache_dir TORCHINDUCTOR_CACHE_DIR=/tmp/caches/torchinductor_cache_dir \
    FLASHINFER_WORKSPACE_BASE=/tmp/caches/flashinfer_workspace_base  # as cold_campaign.py --caches names them
  timeout $((${2:-80} + 60)) python3 benchmarks/campaign_split.py --time-budget ${2:-80} -b flashinfer-decode \
    -b flashinfer-cascade ${3:--b flashinfer-decode-hnd -b sdpa-efficient} > $D/split.log 2>&1
  sed -n '/exited/,$p' $D/split.log
  ;;
warm)  # warm the caches (30 s), then a BUDGET s campaign of eight backends, each worker process count (default: the default)
  timeout 120 python3 benchmarks/cold_campaign.py --time-budget 30 --caches /tmp/caches $B > /dev/null
  for p in ${3:-default}; do
    echo "== PA_ORACLE_WORKER_PROCESSES=$p"
    [ $p = default ] && unset PA_ORACLE_WORKER_PROCESSES || export PA_ORACLE_WORKER_PROCESSES=$p
    timeout $((${2:-120} + 60)) python3 benchmarks/cold_campaign.py --time-budget ${2:-120} \
      --caches /tmp/caches --log $D/warm$p.log $B | grep -v " variants: "
    grep "drawn ahead" $D/warm$p.log
  done
  ;;
cold)  # the main job's 12 backends with fresh caches and the default worker and draw processes, BUDGET s (default 300)
  timeout 420 python3 benchmarks/cold_campaign.py --time-budget ${2:-300} --log $D/cold.log $B \
    -b flashinfer-prefill-fa2-hnd -b flashinfer-prefill-fa3 -b sdpa-math -b flex | grep -v " variants: "
  grep "drawn ahead" $D/cold.log
  ;;
esac
