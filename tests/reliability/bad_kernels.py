"""Hostile user kernels (the canonical signature): each breaks the kernel contract one way (what it
returns, what it raises, what it writes, how it dies). The judge must turn every one into a
finding with its case saved; ``correct`` is the twin that must pass.

They compute with ``pa_oracle.fuzz.quality.planted.correct_attention`` where they compute at all.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

import numpy as np
import torch
from pa_oracle.fuzz.quality.planted import correct_attention


def correct(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    return correct_attention(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                             kv_last_page_len=kv_last_page_len, causal=False, sm_scale=q.shape[-1] ** -0.5,
                             window_left=-1, logits_soft_cap=0.0)


def _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):  # type: ignore[no-untyped-def]
    return correct(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                   kv_last_page_len=kv_last_page_len)


# --- wrong return values --------------------------------------------------------------------------


def returns_numpy(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    out, _ = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    return out.float().cpu().numpy(), None


def returns_list(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    return [1, 2]


def returns_string_lse(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    out, _ = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    return out, "abc"


def returns_none(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    return None


def returns_three(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    out, lse = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    return out, lse, lse


def returns_wrong_shape(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    out, lse = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    return out[:, :, :1], lse


def returns_wrong_dtype(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    out, lse = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    return out.to(torch.int32), lse


def returns_meta_tensor(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """A tensor on another device than the inputs (``meta``: one that holds no data at all)."""
    out, lse = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    return out.to("meta"), lse


def returns_numpy_lse(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    out, lse = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    return out, np.asarray(lse.cpu())


# --- exceptions ----------------------------------------------------------------------------------


def raises_value_error(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    raise ValueError("kernel bug")


def exits_zero(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    sys.exit(0)


def raises_keyboard_interrupt(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Raised by the kernel itself (no signal): the kernel's misbehaviour, not the user's Ctrl-C."""
    raise KeyboardInterrupt


def raises_generator_exit(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    raise GeneratorExit


class _Odd(BaseException):
    pass


def raises_base_exception(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    raise _Odd("neither Exception nor an interrupt")


# --- writes to its inputs ------------------------------------------------------------------------


def _zeroes(name: str):  # type: ignore[no-untyped-def]
    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
        inputs = dict(q=q, k_cache=k_cache, v_cache=v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                      kv_indices=kv_indices, kv_last_page_len=kv_last_page_len)
        result = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
        inputs[name].add_(1)  # a change in every element: zero_() leaves a tensor of zeros alone
        return result

    kernel.__name__ = kernel.__qualname__ = f"writes_{name}"
    return kernel


INPUTS = ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len")
for _name in INPUTS:
    globals()[f"writes_{_name}"] = _zeroes(_name)


def zeroes_kv_indices(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    result = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    kv_indices.zero_()
    return result


# --- deaths --------------------------------------------------------------------------------------


def segfaults(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    os.kill(os.getpid(), signal.SIGSEGV)


def dereferences_null(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    ctypes.string_at(0)


def exits_hard(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    os._exit(3)


def hangs(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    time.sleep(1e9)


def slightly_off(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """1 % too large everywhere: fails the default tolerance, passes a very loose one."""
    out, lse = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    return out * 1.01, lse


def writes_alibi_slopes(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, alibi_slopes):
    """Ignores ALiBi and writes its slopes: the write must be named among the failures."""
    if alibi_slopes is not None:
        alibi_slopes.add_(1)
    return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)


def always_refuses(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    raise NotImplementedError("this kernel supports nothing")


def sleeps_two_seconds(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    time.sleep(2)
    return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)


def slow_correct(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    time.sleep(0.05)
    return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)


# --- found by a hostile review after the first version -------------------------------------------


class _AbsLies(torch.Tensor):
    """A tensor subclass whose ``abs`` returns zeros: it would make every error look like 0."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        result = super().__torch_function__(func, types, args, kwargs or {})
        if func in (torch.abs, torch.Tensor.abs) and isinstance(result, torch.Tensor):
            return torch.zeros_like(result.as_subclass(torch.Tensor))
        return result


def returns_lying_subclass(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    out, _ = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    return torch.zeros_like(out).as_subclass(_AbsLies), None


def returns_complex_lse(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    out, lse = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    return out, lse.to(torch.complex64) + 1000j


def returns_fp8_out(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    out, lse = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    return out.to(torch.float8_e4m3fn), lse


class _StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ itself fails")


def raises_unprintable(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    raise _StrRaises()


def refuses_alibi(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Takes no ``alibi_slopes``: a case with ALiBi is unsupported for it."""
    return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)


def returns_zeros(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal):
    return torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype, device=q.device)


def flips_tf32(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Correct, but turns TF32 on for the whole process (as a library import might)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = not torch.backends.cudnn.allow_tf32
    return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)


def refuses_loosened_numerics(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Correct, unless another kernel's switches leaked into this call."""
    if torch.backends.cuda.matmul.allow_tf32:
        raise RuntimeError("TF32 is on: another backend's setting leaked")
    return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
