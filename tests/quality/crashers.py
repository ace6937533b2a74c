"""User kernels that take the process down or never return: the fuzzer must report them as
findings and keep going."""

from __future__ import annotations

import ctypes
import time

import torch


def segfaults(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    if int(kv_indptr[-1]) > 1:  # the first cases pass; a later one kills the process
        ctypes.string_at(0)
    return torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype)


def hangs(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    time.sleep(3600)
