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


def exits_zero_hard(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    os._exit(0)  # in one process (--no-isolate) this ended the run with status 0, no verdict


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
    """Correct, but turns TF32 on for the whole process during its call (what a library import may do:
    there it is put back silently; during a call it is a finding, put back before the judge runs)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = not torch.backends.cudnn.allow_tf32
    return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)


def refuses_loosened_numerics(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Correct, unless another kernel's switches leaked into this call."""
    if torch.backends.cuda.matmul.allow_tf32:
        raise RuntimeError("TF32 is on: another backend's setting leaked")
    return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)


# --- across the trust boundary (issue 31): writes a weighted sum of the bits cannot see, the case, the judge


DONE: dict[str, object] = {}  # what the last of these kernels did, for an in-process test to check


def old_sums(t: torch.Tensor) -> tuple[int, int]:
    """The input fingerprint the judge kept before issue 31: (sum of the raw bits, sum of the raw bits x
    (position % 65521 + 1)); the writes below leave both as they were."""
    bits = t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).flatten().to(torch.int64)
    return int(bits.sum()), int((bits * (torch.arange(bits.numel()) % 65521 + 1)).sum())


def _scale_three(t: torch.Tensor) -> None:
    """x2, /4, x2 on three consecutive normal elements of ``t`` (flat): exponent bits +1, -2, +1, so the
    raw bits change by (+d, -2d, +d) and both old sums stay."""
    flat = t.view(-1)
    tiny = torch.finfo(t.dtype).tiny * 8
    for start in range(flat.numel() - 2):
        three = flat[start : start + 3].double()
        if bool(torch.isfinite(three).all()) and bool((three.abs() > tiny).all()) and bool((three.abs() < 1e3).all()):
            before = old_sums(t)
            flat[start : start + 3] *= torch.tensor([2.0, 0.25, 2.0], dtype=t.dtype)
            DONE.update(tensor=t.clone(), start=start, sums_kept=old_sums(t) == before)
            return
    raise AssertionError("no three consecutive normal elements")


def scales_q_keeping_sums(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Scales q[0, 0, 0:3] by x2, /4, x2 in place and attends that q."""
    _scale_three(q[0, 0])
    return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)


def scales_k_page_keeping_sums(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """The same on the first K page the layout reads, then attends it."""
    _scale_three(k_cache[int(kv_indices[0])])
    return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)


def swaps_k_65521_apart(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Swaps two different finite elements of the K pool 65521 apart (equal weights mod 65521), then attends."""
    flat = k_cache.view(-1)
    for i in range(flat.numel() - 65521):
        a, b = flat[i].item(), flat[i + 65521].item()
        if a == a and b == b and a != b:
            before = old_sums(k_cache)
            flat[i], flat[i + 65521] = b, a
            DONE.update(i=i, sums_kept=old_sums(k_cache) == before)
            break
    else:
        raise AssertionError("no two different finite elements 65521 apart")
    return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)


def shares_a_page_keeping_sums(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Rewrites kv_indices[j : j + 3] by (+d, -2d, +d) so that entry j + 1 names a page of another request
    (one page read by two requests), every entry still a page of the pool; then attends with them."""
    pages, owner = kv_indices.tolist(), []
    for b in range(len(kv_indptr) - 1):
        owner += [b] * (int(kv_indptr[b + 1]) - int(kv_indptr[b]))
    for j in range(len(pages) - 2):
        for target in (p for p, b in zip(pages, owner) if b != owner[j + 1]):
            d, odd = divmod(pages[j + 1] - target, 2)
            new = [pages[j] + d, target, pages[j + 2] + d]
            if d and not odd and all(0 <= p < k_cache.shape[0] for p in new):
                before = old_sums(kv_indices)
                kv_indices[j : j + 3] = torch.tensor(new, dtype=kv_indices.dtype)
                DONE.update(j=j, shared=target, sums_kept=old_sums(kv_indices) == before)
                return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    raise AssertionError("no rewrite of three entries shares a page")


def rope_scale_to_one(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
                      window_left, logits_soft_cap, rope=None):
    """Ignores the case's RoPE ``scale``, and sets it to 1.0 on the (frozen) rope it was handed."""
    from pa_oracle.fuzz.quality.planted import correct_rope

    if rope is not None:
        DONE.update(rope=rope)
        object.__setattr__(rope, "scale", 1.0)
    return correct_rope(q, k_cache, v_cache, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                        kv_last_page_len=kv_last_page_len, causal=causal, sm_scale=sm_scale, window_left=window_left,
                        logits_soft_cap=logits_soft_cap, rope=rope)


rope_scale_to_one.pa_oracle_capabilities = {"rope": (True,)}  # type: ignore[attr-defined]


def sets_default_dtype_and_matmul_precision(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Correct, but leaves float64 the default dtype and 'medium' the float32 matmul precision."""
    torch.set_default_dtype(torch.float64)
    torch.set_float32_matmul_precision("medium")
    return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)


def _passing_verdict(*args, **kwargs):  # type: ignore[no-untyped-def]
    from pa_oracle.oracle.tolerance import Verdict

    return Verdict(True, [])


def _halved(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):  # type: ignore[no-untyped-def]
    out, lse = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    return out * 0.5, lse


def _swap(patch):  # type: ignore[no-untyped-def]
    """A kernel that applies ``patch`` (to the judge) and returns half the right output."""

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
        patch()
        return _halved(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)

    kernel.__name__ = kernel.__qualname__ = f"swaps_{patch.__name__.lstrip('_')}"
    return kernel


def _judge_rebound():  # type: ignore[no-untyped-def]
    import pa_oracle.fuzz.run.runner

    pa_oracle.fuzz.run.runner.judge = _passing_verdict


def _compare_rebound():  # type: ignore[no-untyped-def]
    import pa_oracle.fuzz.run.runner
    import pa_oracle.oracle.tolerance

    pa_oracle.fuzz.run.runner.compare = pa_oracle.oracle.tolerance.compare = _passing_verdict


def _judge_code_swapped():  # type: ignore[no-untyped-def]
    import pa_oracle.fuzz.run.runner

    pa_oracle.fuzz.run.runner.judge.__code__ = _passing_verdict.__code__


def _verdict_always_passes():  # type: ignore[no-untyped-def]
    from pa_oracle.oracle.tolerance import Verdict

    Verdict.passed = property(lambda self: True, lambda self, value: None)  # a data descriptor beats the field


def _check_case_rebound():  # type: ignore[no-untyped-def]
    import pa_oracle.fuzz.run.runner
    from pa_oracle.fuzz.run.runner import Outcome

    pa_oracle.fuzz.run.runner.check_case = lambda backend, case, *a, **k: Outcome(case, backend.name, "pass", "PASS")


def _tensor_abs_zero():  # type: ignore[no-untyped-def]
    torch.Tensor.abs = lambda self: torch.zeros_like(self)  # every error would read 0


JUDGE_SWAPS = (_judge_rebound, _compare_rebound, _judge_code_swapped, _verdict_always_passes, _check_case_rebound, _tensor_abs_zero)
for _patch in JUDGE_SWAPS:
    globals()[_swap(_patch).__name__] = _swap(_patch)


# --- one output buffer per shape, reused by every call (what a CUDA-graph-captured kernel returns)

REUSED: dict[tuple, list] = {}  # (shape, dtype) -> [out, lse, calls]


def _into_reused(out: torch.Tensor, lse: torch.Tensor):  # type: ignore[no-untyped-def]
    kept = REUSED.setdefault((tuple(out.shape), out.dtype), [torch.empty_like(out), torch.empty_like(lse), 0])
    kept[0].copy_(out)
    kept[1].copy_(lse)
    kept[2] += 1
    return kept[0], kept[1]


def reuses_one_output_buffer(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Correct; each call's output is written into the buffers of the previous call of its shape."""
    return _into_reused(*_good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len))


def reuses_a_buffer_and_reads_page_labels(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Its output depends on which page ids the layout uses (a relabel violation), written into a reused buffer."""
    out, lse = _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    return _into_reused(out * (1 + 2**-12 * int(kv_indices[0])), lse)


def sabotages_the_judge_on_many_pages(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Correct, but on a case of more than 8 pages it rebinds the judge's ``compare`` to fail everything and
    turns TF32 on: its own case must fail naming both, the cases judged beside and after it must not."""
    if kv_indices.numel() > 8:
        import pa_oracle.fuzz.run.runner
        from pa_oracle.oracle.tolerance import Verdict

        pa_oracle.fuzz.run.runner.compare = lambda *args, **kwargs: Verdict(False, ["sabotaged"])
        torch.backends.cuda.matmul.allow_tf32 = True
    return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)


def wraps_manual_seed_as_torch_compile_does(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Correct; wraps ``torch.manual_seed`` (``functools.wraps``) as torch.compile's first call does: a
    library's own doing, not a patch of the judge."""
    import functools

    seed = torch.manual_seed
    torch.manual_seed = functools.wraps(seed)(lambda *args, **kwargs: seed(*args, **kwargs))
    return _good(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)


def loosens_the_tolerance_it_is_judged_with(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
    """Half the right output, after making every ``Tolerance`` in its process allow any error (found
    through ``gc``, set past the frozen dataclass): nothing the watch of the judge's code sees."""
    import gc

    from pa_oracle.oracle.tolerance import Tolerance

    for found in gc.get_objects():
        if isinstance(found, Tolerance):
            for name in ("max_ratio", "mean_ratio", "floor_factor"):
                object.__setattr__(found, name, 1e30)
    return _halved(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
