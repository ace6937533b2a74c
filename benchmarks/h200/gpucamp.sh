#!/usr/bin/env bash
# gpucamp (issue 12): (a) the main fuzz job with fresh compile caches over the FlashInfer + torch backends
# (~4 min), printing per backend the cases judged and the start/compile/judge split; (b) warm cases/s for
# three backends, drawn inside built variants. Assumes the lead's set-up: FlashInfer 0.6.18.post1 with the
# 20 prebuilt sm90 bf16 kernels unpacked into its AOT folder, FLASHINFER_CUDA_ARCH_LIST=9.0a, PYTHONPATH with
# /tmp/site (msgspec + flashinfer), the package installed (-e .). Total wall <= ~8.5 min (timeouts below).
set -u
LOG="${OUT:-/tmp/out}/gpucamp"
mkdir -p "$LOG"
export MAX_JOBS="${MAX_JOBS:-16}" PA_ORACLE_ENGINE="${PA_ORACLE_ENGINE:-auto}"
python -c "import torch, flashinfer; print('torch', torch.__version__, 'flashinfer', flashinfer.__version__, torch.cuda.get_device_name())" 2>&1 | tee "$LOG/env.txt"
python - <<'PY' 2>&1 | tee -a "$LOG/env.txt"
# which compile keys each FlashInfer adapter finds built (prebuilt AOT / JIT cache) before anything runs
from pa_oracle.backends import get_backend
from pa_oracle.fuzz.campaign.variants import plan_variants
from pa_oracle.fuzz.draw.strategies import Limits
for name in ("flashinfer-decode", "flashinfer-decode-tc", "flashinfer-prefill-fa2", "flashinfer-prefill-fa3",
             "flashinfer-ragged-fa2", "flashinfer-cascade", "vllm-flashinfer"):
    plan = plan_variants(get_backend(name), Limits(), budget=0, seed=0)
    print(f"{name}: {len(plan.free)} of {plan.space} keys free: {sorted(set(plan.free.values()))}")
PY

BACKENDS=(-b flashinfer-decode -b flashinfer-decode-tc -b flashinfer-decode-hnd -b flashinfer-prefill-fa2
          -b flashinfer-prefill-fa2-hnd -b flashinfer-prefill-fa3 -b flashinfer-ragged-fa2 -b flashinfer-cascade
          -b vllm-flashinfer -b sdpa-math -b sdpa-efficient -b flex)
echo "== (a) cold campaign, fresh caches, 240 s budget ==" | tee "$LOG/cold.txt"
timeout 330 python benchmarks/cold_campaign.py --time-budget 240 "${BACKENDS[@]}" 2>&1 | tail -60 | tee -a "$LOG/cold.txt"
echo "cold rc=${PIPESTATUS[0]}" | tee -a "$LOG/cold.txt"

echo "== (b) warm cases/s, inside built variants ==" | tee "$LOG/warm.txt"
timeout 170 python benchmarks/fuzz_rate.py -b sdpa-efficient -b flashinfer-decode-tc -b flashinfer-prefill-fa2 -n 120 2>&1 \
  | grep -v Warning | tail -20 | tee -a "$LOG/warm.txt"
echo "warm rc=${PIPESTATUS[0]}" | tee -a "$LOG/warm.txt"
