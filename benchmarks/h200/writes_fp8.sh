#!/usr/bin/env bash
# Issue 34, the write kernels on a GPU, fp8 caches included: `pa-oracle writes` on every GPU write kernel that
# this set of wheels can load, each in its own command with its own time budget and >= 500 cases asked:
#   torch-scatter            torch index_put, fp8 quantised in float32, padding rows (the control)
#   flashinfer-append        FlashInfer 0.6.18.post1 append_paged_kv_cache, bf16/fp16
#   flashinfer-append-fp8    the same kernel into e4m3/e5m2 caches (the adapter quantises; placement judged)
#   sglang-fp8-set-kv        SGLang 0.5.10.post1's fused Triton fp8 write (quantises itself; e4m3)
#   sglang-fp8-set-kv-torch  SGLang's torch copy of set_kv_buffer (divides in the append dtype; e4m3)
# (flash-attn-kvcache-append needs the flash-attn set, which does not fit beside these: not run here.)
# Success: each line "ok   N examples" with N >= 500, or a finding saved under $OUT/writes_fp8/NAME/ with its
# writes.json (replay here: pa-oracle writes -b NAME --case FILE). "INCOMPLETE ... the time budget ran out
# while case X ran" (exit 3) means the cap came before 500 cases (an isolated kernel's campaign ends so when
# its budget ends mid-case): raise that kernel's cap. Other INCOMPLETE lines and "not available" are tool
# problems, not verdicts. About 4 minutes in all, at most ~6: installs (~20 s), FlashInfer's page
# module JIT build, then each kernel until 500 cases or its cap (30, 30, 30, 75, 30 s, worker start included).
#
# Stage here first: ../shared/device/stage.sh flashinfer; ../shared/device/stage.sh triton (msgspec is in
# .device/extra). One run, carrying (about 41 MiB; the AOT attention kernels are not needed):
#   .device/flashinfer/flashinfer_python-0.6.18.post1-py3-none-any.whl
#   .device/flashinfer/apache_tvm_ffi-0.1.15.post2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl
#   .device/flashinfer/nvidia_cutlass_dsl-4.8.1-py3-none-any.whl
#   .device/flashinfer/nvidia_cutlass_dsl_libs_base-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
#   .device/extra   .device/triton
# command: bash benchmarks/h200/writes_fp8.sh
# Writes $OUT/writes_fp8.log (the per-kernel lines) and $OUT/writes_fp8/ (each kernel's full output, findings).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
D=$OUT/writes_fp8; mkdir -p "$D"
LOG=$OUT/writes_fp8.log
say() { echo "$*" | tee -a "$LOG"; }
start=$(date +%s)
say "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"

wheels=$(ls .device/flashinfer/*.whl .device/extra/*.whl .device/triton/*.whl 2>/dev/null)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $wheels \
  > "$D/install.log" 2>&1 || say "# install failed (see writes_fp8/install.log): $(tail -2 "$D/install.log")"

# FlashInfer builds its page module on first use (not among the prebuilt kernels): build it here, once, so
# that no case's timeout counts a compile; then say which write kernels can run and why the others cannot.
timeout 300 python3 - > "$D/setup.log" 2>&1 <<'PY'
import time

t = time.time()
try:
    import flashinfer
    from flashinfer.page import get_page_module

    get_page_module()
    print(f"# flashinfer {flashinfer.__version__}: page module ready in {time.time() - t:.1f} s")
except Exception as exc:  # said, not fatal: the kernels that need it are then unavailable or fail loudly
    print(f"# flashinfer page module: {type(exc).__name__}: {exc}")
from pa_oracle.backends.writes import available

usable, missing = available()
print("# available:", ", ".join(k.name for k in usable))
for name, why in missing.items():
    print(f"# not available: {name}: {why}")
PY
grep "^#" "$D/setup.log" | tee -a "$LOG"
say "# setup done after $(( $(date +%s) - start ))s"

run_kernel() {  # NAME BUDGET_SECONDS
  local name=$1 budget=$2 t0=$(date +%s)
  timeout -k 10 $(( budget + 90 )) python3 -m pa_oracle writes -b "$name" -n 500 --seed 0 --time-budget "$budget" \
    --case-timeout 120 --out "$D/$name" > "$D/$name.out" 2>&1
  local code=$?
  local line; line=$(grep -E "^$name +(ok|FAIL|INCOMPLETE)" "$D/$name.out" | tail -1)
  say "${line:-$name: no result line (see writes_fp8/$name.out): $(tail -1 "$D/$name.out")} [exit $code, $(( $(date +%s) - t0 ))s]"
  grep -E "saved |pa-oracle:" "$D/$name.out" | head -3 | tee -a "$LOG"
}

run_kernel torch-scatter 30
run_kernel flashinfer-append 30
run_kernel flashinfer-append-fp8 30
run_kernel sglang-fp8-set-kv 75  # a Triton compile per (heads, head_dim, page_size, strides): the slow one
run_kernel sglang-fp8-set-kv-torch 30
say "# done after $(( $(date +%s) - start ))s"
