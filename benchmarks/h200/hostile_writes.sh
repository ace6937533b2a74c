#!/usr/bin/env bash
# helper "hostile-writes": the write judge's trust boundary on CUDA (user write kernels then run on the GPU).
# Success: every test passes (the hostile write kernels end as findings on cuda as on the CPU); the library
# write kernels and the attention boundary stay clean with the new switch (flushed denormals) and the
# watched operators of torch.Tensor: each campaign line reads "ok" (no "changed the judge", no
# "numerics switches"). Needs FlashInfer/flash-attn as the other scripts install them (PYTHONPATH=/tmp/site).
set -u
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/hw
timeout 550 python3 -m pytest -q -p no:xdist tests/reliability/test_bad_write_kernels.py -x > $OUT/hw/bad_writes.txt 2>&1
echo "bad write kernels rc=$?"; tail -3 $OUT/hw/bad_writes.txt
timeout 120 python3 -m pytest -q -p no:xdist tests/reliability/test_trust_boundary.py > $OUT/hw/boundary.txt 2>&1
echo "trust boundary rc=$?"; tail -2 $OUT/hw/boundary.txt
for b in torch-scatter flashinfer-append flash-attn-kvcache-append; do
  timeout 60 python3 -m pa_oracle writes -b $b -n 300 --time-budget 45 --out /tmp/hw-$b --overwrite 2>&1 | tail -2
done | tee $OUT/hw/writes.txt
timeout 90 python3 -m pa_oracle fuzz -b flashinfer-decode -b sdpa-math -n 150 --time-budget 60 --out /tmp/hw-attn --overwrite 2>&1 | tail -3 | tee $OUT/hw/attention.txt
