# Issue 40: the seeds' systems through the GSM8k and logit gates on one GPU, in the background, so that no device
# call passes its ten minutes and nothing is lost when one is cut.
#
# Upload (ten calls on one warm machine): `.device/upNN/pNN`, the parts of one tar holding the Qwen2.5-Coder-0.5B
# GGUF (as qwen2.5-coder-0.5b-instruct-q4_k_m.gguf, so the golden file is found), the flashinfer, flash-attn and
# eval wheel sets and GSM8k's jsonl files:  mkdir -p /tmp/up && cp .device/upNN/pNN /tmp/up/
# Then:  STEP=launch bash benchmarks/h200/gates_e2e.sh   unpacks, installs, copies the checkout to /tmp/proj and
# starts the plan below under setsid; each later call runs STEP=poll (waits up to POLL seconds, copies the
# results into $OUT as one tarball).
#
# The plan (every result written as it ends into /tmp/res). lm-eval's generate loop is mostly host work, so the
# questions run in two shards per attention, side by side (batches of 128, so that ten processes fit one H100):
#   A1, A2  gate gsm8k -b vllm-flashinfer --shard i/2   (the hf:sdpa reference first, saved, then the backend)
#   B       logit gates, prefill and decode mode, float64 oracle reference, 16 texts each
#   C       the planted wrapper's GPU test, then fuzz the planted wrapper bug and its control
#   once shard i's reference is saved, with --reference-run, side by side:
#   Di  gate gsm8k -b flash-attn-kvcache-paged --prefill flash-attn-varlen   (page 256)
#   Ei  gate gsm8k -b flashinfer-decode-tc --prefill flashinfer-prefill-fa2
#   Fi  gate gsm8k -b planted_wrappers:flashinfer_decode_short_last_page --prefill flashinfer-prefill-fa2
#   then gate gsm8k-merge of each backend's two shards: the verdict of the whole test set.
set -uo pipefail
RES=/tmp/res
MODEL=/tmp/pack/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
PLANTED=pa_oracle.fuzz.quality.planted_wrappers:flashinfer_decode_short_last_page
CONTROL=pa_oracle.fuzz.quality.planted_wrappers:flashinfer_decode_wrapped

launch() {
  cat /tmp/up/p* > /tmp/pack.tar && echo "${PACK_SHA:?}  /tmp/pack.tar" | sha256sum -c - || exit 1
  rm -rf /tmp/pack && mkdir -p /tmp/pack && tar xf /tmp/pack.tar -C /tmp/pack && rm -f /tmp/pack.tar /tmp/up/p*
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/pack/flashinfer/*.whl \
    /tmp/pack/flash-attn/*.whl /tmp/pack/eval/*.whl 2>&1 | grep -v WARNING
  tar xzf /tmp/pack/flashinfer/*-aot-*.tgz -C /tmp/site/flashinfer/data/ || exit 1
  rm -rf /tmp/proj && mkdir -p /tmp/proj $RES && cp -r . /tmp/proj/ && rm -rf /tmp/proj/.device
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $RES/gpu.txt
  setsid nohup bash benchmarks/h200/gates_e2e.sh plan > $RES/plan.log 2>&1 < /dev/null &
  echo launched
}

gsm8k() {  # NAME ARGS...: one gate, its log and exit status in $RES
  local name=$1; shift
  local t0=$SECONDS
  python3 -m pa_oracle gate gsm8k --model $MODEL --data /tmp/pack/data --batch-size 128 --out $RES/gates "$@" \
    > $RES/$name.log 2>&1
  echo "$name exit $? $((SECONDS - t0)) s $(date -u +%T)" | tee -a $RES/progress.txt
}

shard_pair() {  # I: shard I/2 of every backend, the reference's first
  local i=$1
  gsm8k A$i-vllm-flashinfer -b vllm-flashinfer --shard $i/2 &
  local first=$!
  local ref=$RES/gates/gsm8k/vllm-flashinfer-vs-hf_sdpa-shard-$i-of-2/runs.json
  until [ -f $ref ] || ! kill -0 $first 2> /dev/null; do sleep 3; done
  sleep 2; echo "reference shard $i saved $(date -u +%T)" >> $RES/progress.txt
  gsm8k D$i-flash-attn -b flash-attn-kvcache-paged --prefill flash-attn-varlen --shard $i/2 --reference-run $ref &
  gsm8k E$i-flashinfer-pair -b flashinfer-decode-tc --prefill flashinfer-prefill-fa2 --shard $i/2 --reference-run $ref &
  gsm8k F$i-planted -b $PLANTED --prefill flashinfer-prefill-fa2 --shard $i/2 --reference-run $ref &
  wait
}

merge() {  # NAME FOLDER-STEM: the two shards' verdict as one
  python3 -m pa_oracle gate gsm8k-merge $RES/gates/gsm8k/$2-shard-1-of-2 $RES/gates/gsm8k/$2-shard-2-of-2 \
    --out $RES/merged --json > $RES/merged-$1.json 2> $RES/merged-$1.log
  echo "merged $1 exit $?" | tee -a $RES/progress.txt
}

logit() {  # NAME ARGS...
  local name=$1; shift
  local t0=$SECONDS
  python3 -m pa_oracle gate logits --model $MODEL --data /tmp/pack/data --limit 16 --out $RES/logits/$name --json "$@" \
    > $RES/logit-$name.log 2>&1
  echo "logit $name exit $? $((SECONDS - t0)) s" | tee -a $RES/progress.txt
}

plan() {
  cd /tmp/proj
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=/tmp/site:/tmp/proj PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 OMP_NUM_THREADS=3 \
    HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
  echo "start $(date -u +%T)" >> $RES/progress.txt
  shard_pair 1 &
  local s1=$!
  shard_pair 2 &
  local s2=$!
  (  # the cheap gate beside the expensive one, most telling first (what the time allows)
    logit decode-vllm-flashinfer -b vllm-flashinfer --mode decode
    logit decode-planted -b $PLANTED --mode decode --prefill flashinfer-prefill-fa2
    logit decode-flashinfer-decode-tc -b flashinfer-decode-tc --mode decode --prefill flashinfer-prefill-fa2
    logit decode-flash-attn-kvcache-paged -b flash-attn-kvcache-paged --mode decode --prefill flash-attn-varlen
    logit prefill-vllm-flashinfer -b vllm-flashinfer
  ) &
  (
    python3 -m pytest -q -p no:xdist -p no:cacheprovider tests/quality/test_planted_wrappers.py > $RES/pytest-wrappers.log 2>&1
    echo "pytest planted_wrappers exit $?" | tee -a $RES/progress.txt
    for k in $PLANTED $CONTROL; do
      t0=$SECONDS
      python3 -m pa_oracle fuzz --kernel $k -n 300 --time-budget 45 --out $RES/fuzz/${k##*:} > $RES/fuzz-${k##*:}.log 2>&1
      echo "fuzz ${k##*:} exit $? $((SECONDS - t0)) s" | tee -a $RES/progress.txt
    done
  ) &
  wait $s1 $s2  # the gates' shards: merged as soon as they end, before the logit gates and fuzzing do
  stem=_prefill_flashinfer-prefill-fa2-vs-hf_sdpa
  merge vllm-flashinfer vllm-flashinfer-vs-hf_sdpa
  merge flash-attn flash-attn-kvcache-paged_prefill_flash-attn-varlen-vs-hf_sdpa
  merge flashinfer-pair flashinfer-decode-tc$stem
  merge planted pa_oracle.fuzz.quality.planted_wrappers_flashinfer_decode_short_last_page$stem
  wait
  echo "done $(date -u +%T)" >> $RES/progress.txt
  touch $RES/DONE
}

poll() {  # until DONE or POLL seconds: every 20 s the results so far into $OUT (atomically), so a cut call keeps them
  local end=$((SECONDS + ${POLL:-300}))
  while :; do
    tar czf $OUT/res.partial -C /tmp res && mv $OUT/res.partial $OUT/res.tgz
    cp $RES/progress.txt $OUT/progress.txt 2>/dev/null
    { [ -f $RES/DONE ] || [ $SECONDS -ge $end ]; } && break
    sleep 20
  done
  cat $RES/progress.txt 2>/dev/null
  tail -n 2 $RES/*.log 2>/dev/null | cut -c1-300
}

case "${STEP:-${1:-}}" in
  launch) launch ;;
  plan) plan ;;
  poll) poll ;;
  *) echo "STEP=launch|poll" >&2; exit 2 ;;
esac
