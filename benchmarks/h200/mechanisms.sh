# 2026-12-05, fourth session (issue 32: "keep only the parallel mechanisms that measurably pay"). Carry .device/trees
# (new.tgz = `git archive HEAD`), FlashInfer's wheels and AOT kernels, .device/extra. Warm caches, five backends, the
# default settings against each mechanism switched off alone (one call, one card, default runs first and last for the
# spread): judge threads (PA_ORACLE_JUDGE_THREADS=1), the worker pool (PA_ORACLE_WORKER_PROCESSES=1), draw processes
# (PA_ORACLE_DRAW_PROCESSES=0), tensors drawn ahead (PA_ORACLE_DRAW_AHEAD=off), the pipeline (CampaignConfig.pipeline
# False in a copy of the tree) and two --workers shards.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a
S=${S:-35}
mkdir -p /tmp/new && tar xzf .device/trees/new.tgz -C /tmp/new
cp -r /tmp/new /tmp/nopipe && sed -i 's/    pipeline: bool = True/    pipeline: bool = False/' /tmp/nopipe/fuzz/campaign/config.py
grep -n "pipeline: bool" /tmp/nopipe/fuzz/campaign/config.py
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/flashinfer/*.whl \
  .device/extra/*.whl && tar xzf .device/flashinfer/*-aot-*.tgz -C /tmp/site/flashinfer/data/ || echo "install failed"
nproc; nvidia-smi --query-gpu=name --format=csv,noheader
B="-b flashinfer-decode -b flashinfer-decode-tc -b flashinfer-prefill-fa2 -b sdpa-efficient -b sdpa-math"
mkdir -p /tmp/wc "$OUT/m"
one() {  # name tree env... [-- extra args]
  local name=$1 tree=$2; shift 2
  echo "== $name"
  (cd /tmp/$tree && env PYTHONPATH=/tmp/site:/tmp/$tree "$@" timeout $((S + 60)) python3 benchmarks/cold_campaign.py \
    --time-budget $S --caches /tmp/wc $B $EXTRA --log "$OUT/m/$name.log" 2>&1 | grep -E "cold campaign|split of" )
}
if [ "${ROUND:-1}" = 2 ]; then  # the second call: the two close ones again, alternating with the defaults
  EXTRA="" one warmup new X=1
  for r in 1 2; do
    EXTRA="" one default_$r new X=1
    EXTRA="" one judge_threads_1_$r new PA_ORACLE_JUDGE_THREADS=1
    EXTRA="" one draw_ahead_off_$r new PA_ORACLE_DRAW_AHEAD=off
  done
  exit 0
fi
EXTRA="" one warmup new X=1
EXTRA="" one default new X=1
EXTRA="" one judge_threads_1 new PA_ORACLE_JUDGE_THREADS=1
EXTRA="" one worker_processes_1 new PA_ORACLE_WORKER_PROCESSES=1
EXTRA="" one draw_processes_0 new PA_ORACLE_DRAW_PROCESSES=0
EXTRA="" one draw_ahead_off new PA_ORACLE_DRAW_AHEAD=off
EXTRA="" one pipeline_off nopipe X=1
EXTRA="--workers 2" one workers_2 new X=1
EXTRA="" one all_off nopipe PA_ORACLE_JUDGE_THREADS=1 PA_ORACLE_WORKER_PROCESSES=1 PA_ORACLE_DRAW_PROCESSES=0 PA_ORACLE_DRAW_AHEAD=off
EXTRA="" one default_again new X=1
