# 2026-12-05, second device call (issue 32): carry .device/trees (base.tgz = 22ddeee + the isolation fix 'Sent.raw',
# new.tgz = HEAD), FlashInfer's wheels and AOT kernels, .device/extra. The warm rate before and after the campaign
# redesign on five backends (warm caches, old/new alternating on one card), then the main job briefly (every
# available backend, fresh caches, new tree): every line must be ok or a known finding, none the tool's.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a
R=$PWD
for t in base new; do mkdir -p /tmp/$t && tar xzf .device/trees/$t.tgz -C /tmp/$t; done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/flashinfer/*.whl \
  .device/extra/*.whl && tar xzf .device/flashinfer/*-aot-*.tgz -C /tmp/site/flashinfer/data/ || echo "install failed"
B="-b flashinfer-decode -b flashinfer-decode-tc -b flashinfer-prefill-fa2 -b sdpa-efficient -b sdpa-math"
mkdir -p /tmp/wc "$OUT/warm"
(cd /tmp/new && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 benchmarks/cold_campaign.py --time-budget 60 \
  --caches /tmp/wc $B --log "$OUT/warm/warmup.log" 2>&1 | head -8); echo "warm-up exit $?"
for tree in base new base new; do
  echo "== $tree"
  (cd /tmp/$tree && PYTHONPATH=/tmp/site:$PWD timeout 110 python3 benchmarks/cold_campaign.py --time-budget 45 \
    --caches /tmp/wc $B --log "$OUT/warm/$tree.log" 2>&1 | grep -v " variants: " | head -8)
done
echo "== main job (new tree, fresh caches, 150 s)"
(cd /tmp/new && PYTHONPATH=/tmp/site:$PWD timeout 260 python3 benchmarks/cold_campaign.py --time-budget 150 -n 300 \
  --log "$OUT/main.log" 2>&1 | grep -v " variants: " | head -40)
grep -E "^FINDING|pa-oracle:" "$OUT/main.log" | head -20
