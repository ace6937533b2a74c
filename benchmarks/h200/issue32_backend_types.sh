#!/usr/bin/env bash
# Issue 32 (mypy to zero in backends/): the GPU-only paths the type fixes touched, run where the kernels are.
# FlashInfer's CUDA-graph load now copies K/V through _copy_kv and reads the LSE through raw_lse; the paged
# wrappers' run moved from _FlashInferBackend to _PagedWrapper; flash-attn's graph rows read the LSE by raw_lse.
set -euo pipefail
cd "$(dirname "$0")/../.."
python -m pytest -q -p no:xdist tests/test_cuda_graphs.py tests/test_backends.py tests/test_family_adapters.py \
    -k "flashinfer or flash_attn or flash-attn or graph or rope or pod or vllm" "$@"
pa-oracle fuzz -b flashinfer-decode -b flashinfer-prefill-fa2 -b flashinfer-pod -b flashinfer-decode-rope \
    -b flash-attn-kvcache-paged --examples 40 --seed 32
