# issue 12, session 11 (2026-12-02): the worker judging two cases side by side (pa_oracle.fuzz.run.serve).
# FlashInfer 0.6.18.post1 with its prebuilt sm90 kernels in /tmp/site. Success: the cold 5-minute campaign judges
# >= 5,000 cases, every backend >= 100, >= 60% of the wall time judging; side by side gives the verdicts of one
# at a time on every case (fuzz_rate prints "the same verdict and message on N of N").
export PYTHONPATH=/tmp/site:$PWD FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
mkdir -p $OUT/judge_threads
# warm, through a worker: one at a time against two and three side by side (cases a campaign would not skip as known)
for b in sdpa-efficient flashinfer-decode-tc; do
  timeout 300 python3 benchmarks/fuzz_rate.py -b $b -n 150 --isolated --worker-threads 2,3 2>&1 | grep -v Warning | tail -2
done | tee $OUT/judge_threads/rates.txt
# a 60 s campaign of two backends with one judge thread and with two
for t in 1 2; do
  PA_ORACLE_JUDGE_THREADS=$t timeout 90 python3 -m pa_oracle fuzz -b sdpa-efficient -b flashinfer-decode-tc -n 20000 \
    --time-budget 60 --out /tmp/w$t --overwrite --json > $OUT/judge_threads/camp$t.json 2>$OUT/judge_threads/camp$t.err
  echo "threads=$t rc=$?"
done
# the cold 5-minute campaign (fresh caches), two side by side by default
B="-b flashinfer-decode -b flashinfer-decode-tc -b flashinfer-decode-hnd -b flashinfer-prefill-fa2 -b flashinfer-prefill-fa2-hnd -b flashinfer-prefill-fa3 -b flashinfer-ragged-fa2 -b flashinfer-cascade -b vllm-flashinfer -b sdpa-math -b sdpa-efficient -b flex"
timeout 380 python3 benchmarks/cold_campaign.py --time-budget 300 --log $OUT/judge_threads/campaign.log $B | tee $OUT/judge_threads/cold.txt
