"""Hostile KV-cache write kernels (``pa-oracle writes --kernel tests.reliability.bad_write_kernels:NAME``):
each writes wrongly, writes where it must not, changes what it is given or the judge, or ends its call
oddly. None may end in ``ok``: tests/reliability/test_bad_write_kernels.py runs each through the CLI.
(``correct`` is the control: clean.) Typed loosely on purpose: the signatures are the user's."""
# mypy: ignore-errors
# ruff: noqa: ANN001, ANN201, ANN003

from __future__ import annotations

import gc
import os
import sys
import time
import warnings

import torch

from pa_oracle.backends.writes import WriteCapabilities, WriteKernel
from pa_oracle.oracle.append import AppendCase


def _store(key, value, k_cache, v_cache, slot_mapping, kv_layout, k_scale, v_scale, *, scaled: bool = True) -> None:
    """What a correct write stores (the padding rows left out); ``scaled=False`` forgets the fp8 scales."""
    real = slot_mapping >= 0
    slots = slot_mapping[real]
    page = k_cache.shape[1] if kv_layout == "NHD" else k_cache.shape[2]
    for pool, values, scale in ((k_cache, key, k_scale), (v_cache, value, v_scale)):
        values = values[real]
        if pool.dtype != values.dtype:
            values = (values.double() / (scale if scaled else 1.0)).to(pool.dtype)
        view = pool if kv_layout == "NHD" else pool.permute(0, 2, 1, 3)
        view[slots // page, slots % page] = values


def correct(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    _store(key, value, k_cache, v_cache, slot_mapping, kv_layout, k_scale, v_scale)


def _everything() -> list:
    """Every object ``gc`` tracks (torch's deprecated attributes warn when looked at: quiet)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [found for found in gc.get_objects() if isinstance(found, (torch.Tensor, AppendCase))]


def _spare_page(k_cache, kv_indices) -> int | None:
    """A page no request owns (a canary page), if the pool has one."""
    owned = set(kv_indices.tolist())
    return next((p for p in range(k_cache.shape[0]) if p not in owned), None)


# --- writes outside its slots --------------------------------------------------------------------------------


def writes_a_canary_page(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale, kv_indices):
    correct(key, value, k_cache, v_cache, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    spare = _spare_page(k_cache, kv_indices)
    if spare is not None:
        k_cache[spare].zero_()


def writes_another_requests_slot(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    """Correct, then its first row is written again into the last real row's slot."""
    correct(key, value, k_cache, v_cache, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    real = int((slot_mapping >= 0).sum())
    if real > 1 and not torch.equal(key[0], key[real - 1]):
        first = slot_mapping.clone()
        first[real - 1], first[:real - 1] = slot_mapping[real - 1], -1
        _store(key[[0] * len(key)], value[[0] * len(value)], k_cache, v_cache, first, kv_layout, k_scale, v_scale)


def stores_padding_rows(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    """Stores every row, the padding ones (slot -1) too: slot -1 is the pool's last slot."""
    correct(key, value, k_cache, v_cache, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    if bool((slot_mapping < 0).any()):
        k_cache.view(-1, *k_cache.shape[2:])[-1] = key[-1].to(k_cache.dtype)  # (NHD: the last page's last slot)


def nan_into_fp8_canaries(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale, kv_indices):
    """Correct, then NaN into a canary page (an fp8 cache: the 0x7f code, e4m3's NaN)."""
    correct(key, value, k_cache, v_cache, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    spare = _spare_page(k_cache, kv_indices)
    if spare is not None:
        k_cache[spare].view(torch.uint8).fill_(0x7F) if k_cache.element_size() == 1 else k_cache[spare].fill_(float("nan"))


# --- changes its inputs, or hands back something else ------------------------------------------------------


def _changes(name: str):
    def kernel(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale, **given):
        correct(key, value, k_cache, v_cache, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
        tensors = {"key": key, "value": value, "slot_mapping": slot_mapping, **given}
        target = tensors[name]
        if target.numel():
            target.view(-1)[0] = target.view(-1)[0] + 1
    kernel.__name__ = kernel.__qualname__ = f"changes_{name}"
    return kernel


CHANGED = ("key", "value", "slot_mapping", "kv_indices", "kv_indptr", "kv_last_page_len", "positions", "batch_indices")
for _name in CHANGED:
    globals()[f"changes_{_name}"] = _changes(_name)


def returns_a_written_copy(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    """Writes a copy of the pools and returns it; the pools it was given are untouched."""
    k, v = k_cache.clone(), v_cache.clone()
    correct(key, value, k, v, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    return k, v


def swaps_the_pools_storage(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    """Writes copies, then points the tensors it was handed at them (``set_``): the memory it was given,
    which a caller's other views and CUDA graphs read, is never written."""
    k, v = k_cache.clone(), v_cache.clone()
    correct(key, value, k, v, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    k_cache.set_(k)
    v_cache.set_(v)


def frees_the_pools_memory(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    """Correct, then shrinks the memory under its K pool to nothing (what the judge would read)."""
    correct(key, value, k_cache, v_cache, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    k_cache.untyped_storage().resize_(0)


def makes_its_case_unpicklable(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    """Correct, and puts a lambda into every ``AppendCase`` it finds."""
    correct(key, value, k_cache, v_cache, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    for found in _everything():
        if isinstance(found, AppendCase):
            object.__setattr__(found, "seed", lambda: 0)


KEPT: list[torch.Tensor] = []


def writes_then_restores_keeping_a_view(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    """Writes, puts the canaries back, and keeps a view of the pools (to write later, never done)."""
    before = k_cache.clone(), v_cache.clone()
    correct(key, value, k_cache, v_cache, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    k_cache.copy_(before[0])
    v_cache.copy_(before[1])
    KEPT[:] = [k_cache[:], v_cache[:]]


# --- changes the judge: its copies, its case, its code, torch's numerics ---------------------------------------


def overwrites_the_judges_copy(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale, kv_indices):
    """Zeroes a canary page, and the same page of every other tensor of the pool's shape in the process
    (found through ``gc``: the judge's copy of the pools before the call, what it expects them to keep)."""
    correct(key, value, k_cache, v_cache, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    spare = _spare_page(k_cache, kv_indices)
    if spare is None:
        return
    for found in _everything():
        if isinstance(found, torch.Tensor) and found.shape == k_cache.shape and found.dtype == k_cache.dtype:
            found[spare].zero_()


def forgets_the_scale_and_rescales_the_case(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    """Stores fp8 values unscaled, and sets every ``AppendCase`` in the process (``gc``, past the frozen
    dataclass) to scales 1: what it stored is then what the case asks for."""
    _store(key, value, k_cache, v_cache, slot_mapping, kv_layout, k_scale, v_scale, scaled=False)
    for found in _everything():
        if isinstance(found, AppendCase) and found.quantised:
            object.__setattr__(found, "k_scale", 1.0)
            object.__setattr__(found, "v_scale", 1.0)


class RelabelsItsCase(WriteKernel):
    """A ``WriteKernel`` that stores fp8 values unscaled and sets the scales of the case it is given to 1."""

    capabilities = WriteCapabilities(dtypes=("float8_e4m3fn",), devices=("cpu",))

    def append(self, case, inputs) -> None:
        _store(inputs.append_k, inputs.append_v, inputs.k_pool, inputs.v_pool, inputs.slot_mapping, case.kv_layout,
               case.k_scale, case.v_scale, scaled=False)
        object.__setattr__(case, "k_scale", 1.0)
        object.__setattr__(case, "v_scale", 1.0)


class ReturnsItsPools(WriteKernel):
    """A ``WriteKernel`` that writes copies and returns them (the pools it was given untouched)."""

    capabilities = WriteCapabilities(devices=("cpu",))

    def append(self, case, inputs):
        return returns_a_written_copy(inputs.append_k, inputs.append_v, inputs.k_pool, inputs.v_pool,
                                      slot_mapping=inputs.slot_mapping, kv_layout=case.kv_layout, k_scale=case.k_scale,
                                      v_scale=case.v_scale)


def _passing(*args, **kwargs):
    from pa_oracle.oracle.append import AppendVerdict

    return AppendVerdict(True, (), 0)


def _writes_nothing_after(patch):
    def kernel(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
        patch()
    kernel.__name__ = kernel.__qualname__ = f"writes_nothing_{patch.__name__.lstrip('_')}"
    return kernel


def _rebinds_compare_pools():
    import pa_oracle.fuzz.checks.append
    import pa_oracle.oracle.append

    pa_oracle.fuzz.checks.append.compare_pools = pa_oracle.oracle.append.compare_pools = _passing


def _swaps_compare_pools_code():
    import pa_oracle.oracle.append

    pa_oracle.oracle.append.compare_pools.__code__ = _passing.__code__


def _rebinds_judge_write():
    import pa_oracle.fuzz.checks.append

    real = pa_oracle.fuzz.checks.append.judge_write
    pa_oracle.fuzz.checks.append.judge_write = lambda case, kernel: real(case, kernel)._replace(status="pass")


def _verdict_always_ok():
    from pa_oracle.oracle.append import AppendVerdict

    AppendVerdict.ok = property(lambda self: True, lambda self, value: None)


def _torch_ne_never():
    torch.Tensor.__ne__ = lambda self, other: torch.zeros_like(self, dtype=torch.bool)


def _quantiser_swapped():
    import pa_oracle.oracle.append

    pa_oracle.oracle.append.quantised_values = lambda case, values, scale: (values.to(getattr(torch, case.dtype)),) * 2


PATCHES = (_rebinds_compare_pools, _swaps_compare_pools_code, _rebinds_judge_write, _verdict_always_ok, _torch_ne_never,
           _quantiser_swapped)
for _patch in PATCHES:
    globals()[_writes_nothing_after(_patch).__name__] = _writes_nothing_after(_patch)


def forgets_the_scale_and_swaps_the_quantiser(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    """Stores fp8 values unscaled, and makes the judge's quantiser do the same."""
    _store(key, value, k_cache, v_cache, slot_mapping, kv_layout, k_scale, v_scale, scaled=False)
    import pa_oracle.oracle.append

    pa_oracle.oracle.append.quantised_values = lambda case, values, scale: (values.to(getattr(torch, case.dtype)),) * 2


def flips_tf32(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    """Correct, but turns TF32 matmuls on for the process."""
    torch.backends.cuda.matmul.allow_tf32 = not torch.backends.cuda.matmul.allow_tf32
    correct(key, value, k_cache, v_cache, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)


def sets_default_dtype(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    torch.set_default_dtype(torch.float64)
    correct(key, value, k_cache, v_cache, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)


def flushes_denormals(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    """Correct, but leaves denormals flushed to zero in its thread (the judge's, in one process)."""
    torch.set_flush_denormal(True)
    correct(key, value, k_cache, v_cache, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)


# --- ends its call oddly ------------------------------------------------------------------------------------------


def raises_system_exit(key, value, k_cache, v_cache, *, slot_mapping):
    raise SystemExit(0)


def raises_keyboard_interrupt(key, value, k_cache, v_cache, *, slot_mapping):
    raise KeyboardInterrupt


def raises_generator_exit(key, value, k_cache, v_cache, *, slot_mapping):
    raise GeneratorExit


def returns_true(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    correct(key, value, k_cache, v_cache, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
    return True


def exits_zero_hard(key, value, k_cache, v_cache, *, slot_mapping):
    sys.stdout.flush()
    os._exit(0)


def exits_zero_past_the_guard(key, value, k_cache, v_cache, *, slot_mapping):
    """``posix._exit(0)``: past the judge's refusal of ``os._exit`` (isolated: its worker dies with status 0)."""
    import posix

    sys.stdout.flush()
    posix._exit(0)


def sleeps(key, value, k_cache, v_cache, *, slot_mapping):
    time.sleep(60)


CALLS = {"n": 0}
RIGHT_FOR = 3  # cases written right before it writes nothing


def right_for_three_cases(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    CALLS["n"] += 1
    if CALLS["n"] <= RIGHT_FOR:
        correct(key, value, k_cache, v_cache, slot_mapping=slot_mapping, kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)


def forgets_the_scale(key, value, k_cache, v_cache, *, slot_mapping, kv_layout, k_scale, v_scale):
    """Stores fp8 values unscaled (the control of the two above: a finding by itself)."""
    _store(key, value, k_cache, v_cache, slot_mapping, kv_layout, k_scale, v_scale, scaled=False)
