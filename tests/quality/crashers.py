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


def _many_pages(kv_indptr) -> bool:  # type: ignore[no-untyped-def]
    return int(kv_indptr[-1]) > 1


def segfaults_on_many_pages(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Correct on a case of at most one page; kills the process on any other."""
    from tests.reliability.bad_kernels import correct

    if _many_pages(kv_indptr):
        ctypes.string_at(0)
    return correct(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=kv_last_page_len)


def hangs_on_many_pages(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Correct on a case of at most one page; never returns on any other."""
    from tests.reliability.bad_kernels import correct

    if _many_pages(kv_indptr):
        time.sleep(3600)
    return correct(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=kv_last_page_len)


def wrong_in_a_judge_thread(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Wrong (all zeros) when called from one of a worker's judge threads, correct from its main
    thread: slow enough (50 ms) that the case beside it is judged meanwhile."""
    import threading

    from tests.reliability.bad_kernels import correct

    time.sleep(0.05)
    correct(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=kv_last_page_len)
    # (the first call of torch's float32 CPU path in a process sometimes differs from the next by ~3e-5; a re-judge
    # alone is always the first call of a fresh worker: the result kept is the second)
    out, lse = correct(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                       kv_last_page_len=kv_last_page_len)
    if threading.current_thread().name.startswith("pa-oracle-judge"):
        out = torch.zeros_like(out)
    return out, lse
