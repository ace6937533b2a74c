#!/usr/bin/env bash
# Issue 12, per-case cost: warm cases/s of a judged case on the H200, and where its time goes.
# Run from the repo root on the GPU box (pa_oracle importable, FlashInfer present). < 3 minutes.
# Prints per backend: "NAME on cuda: N cases, X cases/s warm (Y ms a case) ..." and a table of
# ms / torch operators / non-view operators / device waits per stage of a judged case.
# Success: >= 150 cases/s for each backend (before, measured today: decode-tc 87, sdpa-efficient 66.5),
# and waits/case small (compare 1-2, fingerprint 2; before ~20 + ~12).
set -u
mkdir -p "$OUT/perf"
log="$OUT/perf/fuzz_rate.log"
python - <<'PY' 2>&1 | tee "$OUT/perf/env.log"
import torch, importlib
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for m in ("flashinfer", "triton"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as exc:  # noqa: BLE001
        print(m, "unavailable:", exc)
PY
for backend in sdpa-efficient flashinfer-decode-tc flashinfer-prefill-fa2; do
  timeout 58 python benchmarks/fuzz_rate.py -b "$backend" -n 150 --stages 2>&1 | grep -v Warning | tail -14 | tee -a "$log"
done
echo "done" | tee -a "$log"
