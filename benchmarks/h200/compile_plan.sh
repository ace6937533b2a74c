# issue 29 (2026-12-05): one compile plan per command, built together in the background while ready backends judge.
# FlashInfer 0.6.18.post1 with its 20 prebuilt sm90 kernels and a msgspec wheel in /tmp/site (../shared/device/README.md).
# Success: the main job with every available backend judges >= 100 cases per backend, >= 5,000 in all, exit 0 or 1;
# replay of golden/cases on five FlashInfer backends < 180 s cold, < 30 s with the kept caches; triage --upstream < 60 s.
# Steps: bash compile_plan.sh install | smoke BUDGET | main BUDGET | replay | triage [CASE BACKEND] | fi07-part0 | fi07
export PYTHONPATH=/tmp/site:$PWD FLASHINFER_CUDA_ARCH_LIST=9.0a PYTHONUNBUFFERED=1
D=$OUT/compile_plan; mkdir -p $D
FIVE="-b flashinfer-decode -b flashinfer-decode-tc -b flashinfer-prefill-fa2 -b flashinfer-prefill-fa3 -b flashinfer-ragged-fa2"
case "$1" in
install)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/flashinfer/*.whl \
    .device/extra/*.whl && tar xzf .device/flashinfer/*-aot-*.tgz -C /tmp/site/flashinfer/data/ || exit 1
  python3 -c "import flashinfer, msgspec; print('flashinfer', flashinfer.__version__)"
  ;;
smoke)  # a few backends that need builds, fresh caches
  timeout $((${2:-90} + 90)) python3 benchmarks/cold_campaign.py --time-budget ${2:-90} --log $D/smoke.log \
    -b flashinfer-decode -b flashinfer-prefill-fa2-rope -b flashinfer-pod -b flex -b sdpa-math
  ;;
main)  # the README's main job, every available backend, fresh caches (kept in /tmp/pacache for the steps after)
  rm -rf /tmp/pacache; mkdir -p /tmp/pacache
  timeout $((${2:-480} + 100)) python3 benchmarks/cold_campaign.py --time-budget ${2:-480} -n 500 --caches /tmp/pacache \
    --log $D/main.log
  ;;
replay)  # the corpus on five FlashInfer backends: fresh caches, then again with the caches kept
  rm -rf /tmp/pacache-replay
  for run in cold kept; do
    start=$(date +%s.%N)
    PA_ORACLE_CACHE_DIR=/tmp/pacache-replay timeout 400 python3 -m pa_oracle replay golden/cases $FIVE \
      --output $D/replay-0.6-$run.json > $D/replay-$run.log 2>&1; code=$?
    echo "replay $run: exit $code in $(python3 -c "import time; print(f'{time.time() - $start:.1f}')")s"
    tail -1 $D/replay-$run.log; grep -i "built\|build" $D/replay-$run.log | tail -3
  done
  cp $D/replay-0.6-kept.json /tmp/replay-0.6.json
  ;;
triage)  # a FlashInfer finding of the corpus, triaged with an upstream report (cross-checks on built variants only)
  rm -rf $D/triage $D/upstream
  start=$(date +%s.%N)
  PA_ORACLE_CACHE_DIR=/tmp/pacache-replay timeout 300 python3 -m pa_oracle triage golden/cases/${2:-flashinfer-decode-alibi-soft-cap.json} \
    -b ${3:-flashinfer-decode} --out $D/triage --upstream $D/upstream > $D/triage.log 2>&1; code=$?
  echo "triage: exit $code in $(python3 -c "import time; print(f'{time.time() - $start:.1f}')")s"; tail -15 $D/triage.log
  ;;
fi07-part0)  # run 1 of the version regression: part 0 of the 0.7.2.post1 wheel (send .device/fi07a)
  mkdir -p /tmp/fi07 && cp .device/fi07a/part0 /tmp/fi07/ && ls -la /tmp/fi07
  ;;
fi07)  # run 2 (send .device/fi07b): the corpus on 0.7.2.post1, then replay-compare against the 0.6.18.post1 record
  [ -f /tmp/replay-0.6.json ] || { echo "no 0.6 record in /tmp (run the replay step on this warm machine first)"; exit 1; }
  cat /tmp/fi07/part0 .device/fi07b/part1 > /tmp/fi07/flashinfer_python-0.7.2.post1-py3-none-any.whl \
    && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site07 /tmp/fi07/*.whl \
       .device/fi07b/*.whl || exit 1
  export PYTHONPATH=/tmp/site07:/tmp/site:$PWD
  python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)"
  start=$(date +%s.%N)
  PA_ORACLE_CACHE_DIR=/tmp/pacache-07 timeout 420 python3 -m pa_oracle replay golden/cases $FIVE \
    --output $D/replay-0.7.json > $D/replay-0.7.log 2>&1; code=$?
  echo "replay 0.7.2.post1 (cold): exit $code in $(python3 -c "import time; print(f'{time.time() - $start:.1f}')")s"
  tail -1 $D/replay-0.7.log; grep -i "built .* variants" $D/replay-0.7.log
  python3 -m pa_oracle replay-compare /tmp/replay-0.6.json $D/replay-0.7.json > $D/compare.txt 2>&1; echo "compare: exit $?"
  cat $D/compare.txt | head -60
  ;;
esac
