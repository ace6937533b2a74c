"""Runtime option flags against the constexpr kernel they replaced (issue 12), on CUDA: the serving
batch's time with each kernel, their ratio, and how many compiled variants each needs for a spread
of group sizes x option combinations; where the runtime kernel costs >= 10%, each option compiled
in alone (``FusedConfig.static_options``) says which one to keep constexpr.

    python benchmarks/fused_oracle_speed.py --specializations
    python benchmarks/fused_specializations.py [--repeat 5] [--attribute-budget 90] [--attribute]

The constexpr kernel is ``fused_constexpr.py`` + ``fused_constexpr_kernel.py``: benchmark-only
copies of ``oracle/fused.py`` and ``oracle/_fused_kernel.py`` at 9bc8e9c.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from dataclasses import replace

import fused_constexpr as constexpr_oracle  # the sibling copies (benchmarks/ is sys.path[0])
import fused_constexpr_kernel as constexpr_kernel
import torch
from oracle_speed import serving_case, timed
from pa_oracle.oracle import _fused_kernel as runtime_kernel
from pa_oracle.oracle.case import Case, Heads, Layout, Options, alibi_slopes
from pa_oracle.oracle.fused import DEFAULT_CONFIG, STATIC_NAMES, FusedConfig, compile_keys, fused_reference
from pa_oracle.oracle.tensors import make_tensors

THRESHOLD = 0.10  # issue 12: a runtime flag may cost < 10% on the serving batch
GROUPS = (1, 2, 4, 8)
OPTIONS = ("causal", "window", "soft_cap", "alibi", "sinks", "logit_noise")


def _old_config(config: FusedConfig) -> constexpr_oracle.FusedConfig:
    fields = constexpr_oracle.FusedConfig.__dataclass_fields__
    return constexpr_oracle.FusedConfig(**{name: getattr(config, name) for name in fields})


def _new(case: Case, tensors, noise: bool, config: FusedConfig = DEFAULT_CONFIG):  # type: ignore[no-untyped-def]
    result = fused_reference(case, tensors, logit_noise=noise, config=config)
    assert result is not None, "fused_reference declined the case"
    return result


def _old(case: Case, tensors, noise: bool, config: FusedConfig = DEFAULT_CONFIG):  # type: ignore[no-untyped-def]
    result = constexpr_oracle.fused_reference(case, tensors, logit_noise=noise, config=_old_config(config))
    assert result is not None, "the constexpr oracle declined the case"
    return result


def _first_call(fn: Callable[[], object]) -> float:
    """Seconds of a first call (compiles, or loads from Triton's disk cache) and its run."""
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def spread() -> list[tuple[Case, bool]]:
    """Every group size of ``GROUPS`` x every on/off combination of ``OPTIONS`` (256 cases), head
    dim 128, bf16, over one batch of decode (split) and prefill requests."""
    drawn = []
    layout = Layout.from_lengths([1, 1, 3, 40], [2000, 90, 700, 300], page_size=16)
    for group, bits in itertools.product(GROUPS, itertools.product((False, True), repeat=len(OPTIONS))):
        on = dict(zip(OPTIONS, bits))
        heads = Heads(8 * group, 8, 128, 128)
        options = Options(
            causal=on["causal"], window_left=256 if on["window"] else -1, logits_soft_cap=30.0 if on["soft_cap"] else 0.0,
            alibi_slopes=alibi_slopes(heads.num_qo_heads) if on["alibi"] else None,
            sinks=(0.5,) * heads.num_qo_heads if on["sinks"] else None, q_dtype="bfloat16", kv_dtype="bfloat16",
        )  # fmt: skip
        drawn.append((Case(layout, heads, options), on["logit_noise"]))
    return drawn


def old_compile_keys(case: Case, tensors, noise: bool) -> set[tuple]:  # type: ignore[no-untyped-def]
    """The constexpr kernel's compile keys for ``case``: its launches recorded, not run."""
    keys: set[tuple] = set()

    class Recorder:
        def __init__(self, fn: Callable) -> None:
            self.fn = fn

        def __getitem__(self, grid: tuple[int]) -> Callable[..., None]:
            return lambda *args, **kwargs: keys.add(runtime_kernel.specialization_key(self.fn, (), args, kwargs))

    kernels = constexpr_kernel.attention, constexpr_kernel.merge
    constexpr_kernel.attention, constexpr_kernel.merge = Recorder(constexpr_kernel._attention), Recorder(constexpr_kernel._merge)
    try:
        constexpr_oracle.fused_attention(case, tensors, logit_noise=noise)
    finally:
        constexpr_kernel.attention, constexpr_kernel.merge = kernels
    return keys


def count_variants() -> None:
    cases = spread()
    old_keys: set[tuple] = set()
    new_keys: set[tuple] = set()
    pools: dict[int, object] = {}  # per group size: the options change no tensor, so no key of theirs
    for case, noise in cases:
        tensors = pools.setdefault(case.heads.group_size, make_tensors(case, "cuda"))
        old_keys |= old_compile_keys(case, tensors, noise)
        new_keys |= compile_keys(case, tensors, logit_noise=noise)
    print(f"compiled variants for {len(cases)} cases ({len(GROUPS)} group sizes x {2 ** len(OPTIONS)} combinations of "
          f"{', '.join(OPTIONS)}; head dim 128, bf16, default config): constexpr kernel {len(old_keys)}, "
          f"runtime-flag kernel {len(new_keys)}")  # fmt: skip


def serving_times(repeat: int) -> dict[bool, float]:
    """Old vs new on the serving batch, without and with logit noise; returns new / old per noise."""
    case = serving_case()
    tensors = make_tensors(case, "cuda")
    ratios = {}
    for noise in (False, True):
        old_first = _first_call(lambda: _old(case, tensors, noise))
        new_first = _first_call(lambda: _new(case, tensors, noise))
        old_t = timed(lambda: _old(case, tensors, noise), "cuda", repeat)
        new_t = timed(lambda: _new(case, tensors, noise), "cuda", repeat)
        a, b = _old(case, tensors, noise), _new(case, tensors, noise)
        same = torch.equal(a.out, b.out) and torch.equal(a.lse, b.lse) and (not noise or torch.equal(a.logit_noise, b.logit_noise))
        diff = float((a.out - b.out).abs().max())
        ratios[noise] = new_t / old_t
        print(f"serving batch, logit_noise={noise}: constexpr kernel {old_t * 1e3:.3f} ms, runtime-flag kernel {new_t * 1e3:.3f} ms "
              f"-> runtime / constexpr = {new_t / old_t:.3f} ({'< 10%: runtime flags stay' if new_t / old_t < 1 + THRESHOLD else '>= 10%'}); "
              f"first call (compile or disk cache) {old_first:.1f} s vs {new_first:.1f} s; "
              f"results {'bitwise equal' if same else f'differ, max |d out| {diff:.3g}'}")  # fmt: skip
    return ratios


def attribute(ratios: dict[bool, float], repeat: int, budget: float, force: bool) -> None:
    """Each option compiled in alone: the runtime kernel's cost per option, where a ratio reached the
    threshold (or ``force``); stops when ``budget`` seconds are spent."""
    settings = [noise for noise, ratio in ratios.items() if ratio >= 1 + THRESHOLD or force]
    if not settings:
        print("every runtime flag costs < 10% together: static_options stays empty")
        return
    case = serving_case()
    tensors = make_tensors(case, "cuda")
    start, keep = time.perf_counter(), set()
    names = ("logit_noise", "partial", "causal", "head_dims", "group", "sinks", "soft_cap", "alibi", "window")
    assert set(names) == set(STATIC_NAMES)
    for noise in settings:
        runtime_t = timed(lambda: _new(case, tensors, noise), "cuda", repeat)
        static_all = replace(DEFAULT_CONFIG, static_options=STATIC_NAMES)
        all_t = timed(lambda: _new(case, tensors, noise, static_all), "cuda", repeat)
        print(f"logit_noise={noise}: runtime-flag kernel {runtime_t * 1e3:.3f} ms; every option compiled in (static_options=all) "
              f"{all_t * 1e3:.3f} ms -> runtime costs {runtime_t / all_t - 1:+.1%}")  # fmt: skip
        for name in names:
            if time.perf_counter() - start > budget:
                print(f"  attribution budget ({budget:.0f} s) spent: {name} and after not measured")
                break
            config = replace(DEFAULT_CONFIG, static_options=(name,))
            static_t = timed(lambda: _new(case, tensors, noise, config), "cuda", repeat)
            cost = runtime_t / static_t - 1
            if cost >= THRESHOLD:
                keep.add(name)
            print(f"  {name} compiled in: {static_t * 1e3:.3f} ms -> its runtime test costs {cost:+.1%}{'  KEEP STATIC' if cost >= THRESHOLD else ''}")
    print(f"recommended FusedConfig.static_options: {tuple(sorted(keep))}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs after a warm-up; the best counts")
    parser.add_argument("--attribute", action="store_true", help="time each option compiled in even when the runtime kernel costs < 10%%")
    parser.add_argument("--attribute-budget", type=float, default=90.0, help="seconds for the per-option attribution (its compiles)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    ratios = serving_times(args.repeat)
    count_variants()
    attribute(ratios, args.repeat, args.attribute_budget, args.attribute)


if __name__ == "__main__":
    main()
