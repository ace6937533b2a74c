# 2026-12-05 (issues 32, 34): one device call. Run from the repo root, carrying the committed trees .device/new (HEAD)
# and .device/base (22ddeee, before the campaign config / run class), FlashInfer's four wheels, .device/extra, .device/triton.
# 1. issue 34: benchmarks/h200/writes_fp8.sh from the new tree (fp8 write kernels, 500 cases each under a cap).
# 2. issue 32: the warm rate before and after the redesign: the same three backends, warm caches, the same budget,
#    old tree then new tree then old then new (cases judged per judge-second per backend; same card, same call).
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a
R=$PWD
ln -sfn "$R/.device" "$R/.device/new/.device"
(cd "$R/.device/new" && timeout 360 bash benchmarks/h200/writes_fp8.sh) || echo "writes_fp8: exit $?"
B="-b sdpa-math -b sdpa-efficient -b flex"
mkdir -p /tmp/wc "$OUT/warm"
(cd "$R/.device/new" && PYTHONPATH=/tmp/site:$PWD timeout 120 python3 benchmarks/cold_campaign.py --time-budget 30 \
  --caches /tmp/wc $B > "$OUT/warm/warmup.log" 2>&1); echo "warm-up exit $?"
for tree in base new base new; do
  echo "== $tree"
  (cd "$R/.device/$tree" && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 benchmarks/cold_campaign.py --time-budget 35 \
    --caches /tmp/wc $B --log "$OUT/warm/$tree.log" 2>&1 | grep -v " variants: " | head -6)
done
