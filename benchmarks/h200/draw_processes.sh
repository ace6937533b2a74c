# issue 12, session 12 (2026-12-03): drawing the chunks ahead in helper processes (pa_oracle.fuzz.campaign.drawers).
# FlashInfer 0.6.18.post1 with its prebuilt sm90 kernels and a msgspec wheel in /tmp/site (../shared/device/README.md).
# Success: the same cases with and without draw processes (seen lists equal), and the backends bound by the
# campaign's own draws (FlashInfer decode, cascade) judging more cases a second with them.
# Steps: bash draw_processes.sh same | campaign ["3 0"] | workers [BUDGET] | cold [BUDGET]
export PYTHONPATH=/tmp/site:$PWD FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
D=$OUT/draw_processes; mkdir -p $D /tmp/caches
export TRITON_CACHE_DIR=/tmp/caches/triton_cache_dir TORCHINDUCTOR_CACHE_DIR=/tmp/caches/torchinductor_cache_dir \
  FLASHINFER_WORKSPACE_BASE=/tmp/caches/flashinfer_workspace_base  # as cold_campaign.py --caches /tmp/caches names them
B="-b flashinfer-decode -b flashinfer-decode-tc -b flashinfer-decode-hnd -b flashinfer-cascade -b sdpa-efficient"
case "$1" in
same)  # 500 decode-tc examples inside the prebuilt variants, no draw process against three: the same cases
  for p in 0 3; do
    PA_ORACLE_DRAW_PROCESSES=$p timeout 200 python3 -m pa_oracle fuzz -b flashinfer-decode-tc -n 500 --seed 5 \
      --compile-budget 0.001 --out /tmp/same$p --overwrite > $D/same$p.txt 2>&1; echo "draw processes $p: rc=$?"
  done
  python3 - <<'PY'
import json
a, b = (json.load(open(f"/tmp/same{p}/campaign.json"))["backends"] for p in (0, 3))
for key in a:
    x, y = a[key], b[key]
    print(key, "same cases in the same order:", x["seen"] == y["seen"], len(x["seen"]), "drawn;",
          {k: (x[k], y[k]) for k in ("examples", "passed", "skipped_known", "status")})
PY
  ;;
campaign)  # a 150 s campaign of the draw-bound backends (30 s each), with three draw processes and with none
  for p in ${2:-3 0}; do
    echo "== PA_ORACLE_DRAW_PROCESSES=$p"
    PA_ORACLE_DRAW_PROCESSES=$p timeout 230 python3 benchmarks/cold_campaign.py --time-budget 150 --caches /tmp/caches \
      --log $D/camp$p.log $B
    grep "drawn ahead" $D/camp$p.log
  done
  ;;
cold)  # the main job's 12 backends with fresh caches and draw processes (the default count), BUDGET s (default 300)
  timeout 400 python3 benchmarks/cold_campaign.py --time-budget ${2:-300} --log $D/cold.log $B -b flashinfer-prefill-fa2 \
    -b flashinfer-prefill-fa2-hnd -b flashinfer-prefill-fa3 -b flashinfer-ragged-fa2 -b vllm-flashinfer -b sdpa-math -b flex
  grep "drawn ahead" $D/cold.log
  ;;
workers)  # warm the caches (25 s), then the same 150 s campaign with one worker and with two shards side by side
  timeout 100 python3 benchmarks/cold_campaign.py --time-budget 25 --caches /tmp/caches $B | head -1
  for w in 1 2; do
    echo "== --workers $w (draw processes: the default)"
    timeout 180 python3 benchmarks/cold_campaign.py --time-budget ${2:-150} --caches /tmp/caches --workers $w --log $D/workers$w.log $B
    grep "drawn ahead" $D/workers$w.log
  done
  ;;
profile)  # where a warm decode-tc campaign process spends its time (cProfile), and the in-process judge rate
  PA_ORACLE_DRAW_PROCESSES=3 timeout 120 python3 -m cProfile -o $D/decode-tc.prof -m pa_oracle fuzz -b flashinfer-decode-tc \
    -n 100000 --time-budget 40 --out /tmp/prof --overwrite > $D/prof.txt 2>&1
  python3 -c "import pstats; pstats.Stats('$D/decode-tc.prof').sort_stats('tottime').print_stats(30)" > $D/prof_tottime.txt
  python3 -c "import pstats; pstats.Stats('$D/decode-tc.prof').sort_stats('cumulative').print_stats(60)" > $D/prof_cumulative.txt
  tail -3 $D/prof.txt
  timeout 200 python3 benchmarks/fuzz_rate.py -b flashinfer-decode-tc -b flashinfer-cascade -b sdpa-efficient -n 300 2>&1 | grep -v Warning | tail -6
  ;;
esac
