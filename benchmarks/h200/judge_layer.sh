#!/usr/bin/env bash
# Issue 32, one judging layer (fuzz/run/judge.py, fuzz/campaign/chunks.py): the engine judges through Judge
# (InProcessJudge / IsolatedJudge, chosen by judge_for); Prefetch and overlap.py are gone. Run it on this branch,
# then on main, on the same warm machine (the warm rate must be no slower; the same seed must draw the same cases).
# Steps: bash judge_layer.sh tests | rate [BUDGET]
set -u
D=$OUT/judge_layer; mkdir -p $D
case "${1:-tests}" in
tests)  # on CUDA the worker makes the verdict (verdict_in_parent False): the judge layer's tests on that path
  timeout 590 python -m pytest -q -p no:xdist tests/test_judge.py tests/test_overlap.py tests/test_same_draws.py \
    tests/test_worker_pool.py 2>&1 | tail -15 | tee $D/tests.log
  ;;
rate)  # the warm campaign rate of eight backends (warm_rate.sh warm): cases/s per backend, to compare with main's
  bash benchmarks/h200/warm_rate.sh warm ${2:-120} 2>&1 | tee $D/rate.log
  ;;
esac
