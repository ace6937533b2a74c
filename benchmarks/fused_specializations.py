"""Runtime option flags against the constexpr kernel they replaced (issue 12), on CUDA: the serving
batch's time with each kernel, their ratio, and how many compiled variants each needs for a spread
of group sizes x option combinations; each option compiled in alone (``FusedConfig.static_options``)
says what its runtime test costs, and which to keep constexpr (>= 10%).

    python benchmarks/fused_oracle_speed.py --specializations
    python benchmarks/fused_specializations.py [--repeat 5] [--jobs 16]

The variants compile first in ``--jobs`` parallel processes (into Triton's disk cache), then one
process times them all.

The constexpr kernel is ``baseline/fused_constexpr.py`` + ``baseline/fused_constexpr_kernel.py``: benchmark-only
copies of ``oracle/fused.py`` and ``oracle/_fused_kernel.py`` at 9bc8e9c.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from dataclasses import replace

import torch
from baseline import fused_constexpr as constexpr_oracle  # benchmarks/baseline/ (benchmarks/ is sys.path[0])
from baseline import fused_constexpr_kernel as constexpr_kernel
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
        if case.heads.group_size not in pools:
            pools[case.heads.group_size] = make_tensors(case, "cuda")
        tensors = pools[case.heads.group_size]
        old_keys |= old_compile_keys(case, tensors, noise)
        new_keys |= compile_keys(case, tensors, logit_noise=noise)
    tiles = {(name, dict((entry[0], entry[-1]) for entry in spec)["BLOCK_M"]) for name, spec, _ in new_keys}
    print(f"compiled variants for {len(cases)} cases ({len(GROUPS)} group sizes x {2 ** len(OPTIONS)} combinations of "
          f"{', '.join(OPTIONS)}; head dim 128, bf16, default config): constexpr kernel {len(old_keys)}, "
          f"runtime-flag kernel {len(new_keys)} (kernel x tile height: {len(tiles)})")  # fmt: skip


# what the serving batch is timed with: the constexpr kernel, the runtime-flag kernel, every option
# compiled in, and each option the serving batch exercises (or whose code it carries: the noise
# accumulator, the split's partial store) compiled in alone; the options it never turns on (window,
# soft cap, ALiBi, sinks) are in "every option static" only
ATTRIBUTED = ("logit_noise", "partial", "causal", "head_dims", "group")
VARIANTS: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("constexpr kernel (9bc8e9c)", None),
    ("runtime-flag kernel", ()),
    ("every option static", STATIC_NAMES),
    *((f"{name} static", (name,)) for name in ATTRIBUTED),
)


def _call(static: tuple[str, ...] | None, case: Case, tensors, noise: bool):  # type: ignore[no-untyped-def]
    if static is None:
        return _old(case, tensors, noise)
    return _new(case, tensors, noise, replace(DEFAULT_CONFIG, static_options=static))


def _warm(job: tuple[tuple[str, ...] | None, bool]) -> float:
    """A worker process: one serving-batch call of a variant, which compiles it into Triton's disk
    cache (``TRITON_CACHE_DIR``, shared with the parent)."""
    static, noise = job
    case = serving_case()
    tensors = make_tensors(case, "cuda")
    return _first_call(lambda: _call(static, case, tensors, noise))


def warm_up(jobs: int) -> None:
    """Compile every variant in parallel processes: Triton compiles one kernel at a time per
    process, and the float64 kernels take seconds each."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    work = [(static, noise) for _, static in VARIANTS for noise in (False, True) if static != () or noise]
    start = time.perf_counter()
    try:
        with ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=multiprocessing.get_context("spawn")) as pool:
            seconds = list(pool.map(_warm, work))
    except Exception as exc:  # noqa: BLE001 - the timings below compile what is missing, serially
        print(f"warm-up failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}): compiling in this process")
        return
    print(f"warm-up: {len(work)} variant x logit_noise calls in {min(jobs, len(work))} processes, {time.perf_counter() - start:.1f} s "
          f"(one call, compiles included: {min(seconds):.1f}-{max(seconds):.1f} s)")  # fmt: skip


def serving_times(repeat: int) -> None:
    """Every variant on the serving batch, without and with logit noise: the runtime-flag kernel
    against the constexpr one, and each option compiled in alone against the runtime-flag kernel."""
    case = serving_case()
    tensors = make_tensors(case, "cuda")
    keep = set()
    for noise in (False, True):
        first = {label: _first_call(lambda: _call(static, case, tensors, noise)) for label, static in VARIANTS}
        times = {label: timed(lambda: _call(static, case, tensors, noise), "cuda", repeat) for label, static in VARIANTS}
        old_t, new_t = times[VARIANTS[0][0]], times[VARIANTS[1][0]]
        a, b = _old(case, tensors, noise), _new(case, tensors, noise)
        same = torch.equal(a.out, b.out) and torch.equal(a.lse, b.lse) and (not noise or torch.equal(a.logit_noise, b.logit_noise))
        diff = float((a.out - b.out).abs().max())
        print(f"serving batch, logit_noise={noise}: constexpr kernel {old_t * 1e3:.3f} ms, runtime-flag kernel {new_t * 1e3:.3f} ms "
              f"-> runtime / constexpr = {new_t / old_t:.3f} ({'< 1.10' if new_t / old_t < 1 + THRESHOLD else '>= 1.10'}); "
              f"results {'bitwise equal' if same else f'differ, max |d out| {diff:.3g}'}; "
              f"first calls {first[VARIANTS[0][0]]:.2f} s vs {first[VARIANTS[1][0]]:.2f} s")  # fmt: skip
        for label, static in VARIANTS[2:]:
            cost = new_t / times[label] - 1
            if cost >= THRESHOLD and static != STATIC_NAMES:
                keep.update(static or ())
            print(f"  {label}: {times[label] * 1e3:.3f} ms -> the runtime test costs {cost:+.1%}"
                  f"{'  (>= 10%: keep static)' if cost >= THRESHOLD and static != STATIC_NAMES else ''}")  # fmt: skip
    print(f"recommended FusedConfig.static_options (an option whose runtime test costs >= 10% in either setting): {tuple(sorted(keep))}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs after a warm-up; the best counts")
    parser.add_argument("--jobs", type=int, default=16, help="processes compiling the variants ahead (0: compile in this one)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    count_variants()  # no compile: first
    if args.jobs > 0:
        warm_up(args.jobs)
    serving_times(args.repeat)


if __name__ == "__main__":
    main()
