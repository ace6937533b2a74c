"""Cases per second of a fuzz campaign with warm kernels, and where the time goes (a benchmark).

    python benchmarks/fuzz_rate.py -b sdpa-math             # CPU
    python benchmarks/fuzz_rate.py -b flashinfer-decode -b flash-attn-kvcache-paged -n 100

Draws ``-n`` cases per backend from the campaign's own strategy (fixed seed; for an adapter that
compiles per variant, inside the variants a campaign with ``--compile-budget`` would use: the
prebuilt/cached ones and as many more as the budget pays for, default 0: at least one), runs each
once to warm (compile) the kernel variants, then times a second pass of ``check_case``: the whole judge
(tensors, kernel, float64 oracle, two controls, comparison) and, separately, the kernel call
alone on the same cases. Prints cases/s and the kernel's share of the time. ``--stages`` adds
one more pass per table: the time of each stage of a judged case (the functions ``check_case``
calls), and, in a pass of its own, the torch operators each stage dispatches and how many of them
wait on the device (a host read: ``.item()``, a boolean-mask index, a copy to the host), and how
many are not views (on a GPU, about the kernel launches): each operator costs the host ~5-20 us
and each wait a stream sync, so these counts transfer from the CPU to the GPU (the kernel's own
are not counted: it runs outside the counting mode, which a compiled kernel cannot run under).
``--isolated`` judges through a campaign's worker process with
``--queue`` cases queued (the cases a campaign would not skip as known), in fresh workers judging one
case at a time and ``--worker-threads`` cases side by side
(``pa_oracle.fuzz.run.serve``), with the verdicts compared. ``--threads N``
judges the cases in N threads, the kernel calls one at a time (a design question: does the host work of
two judged cases overlap?), against one thread, and says whether every verdict is the same.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch
from hypothesis import HealthCheck, given, seed, settings
from pa_oracle.backends import get_backend
from pa_oracle.fuzz.run import runner
from pa_oracle.backends.base import Backend
from pa_oracle.fuzz.campaign.ledger import GOLDEN, known_finding, load_ledger
from pa_oracle.fuzz.campaign.variants import plan_variants
from pa_oracle.fuzz.cli import narrow
from pa_oracle.fuzz.draw.determinism import seed_only_draws
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.run.isolation import IsolatedBackend, Worker, isolatable
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.fuzz.run.serve import NO_CASE, KernelLock, KernelTurns
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import Tensors, make_tensors
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

# what check_case calls, by stage: (owner, attribute); an attribute the code no longer has is skipped
STAGES = {
    "tensors": [(runner, "make_tensors")],
    "plan": [(runner, "shared_plan")],
    "fingerprint": [(Tensors, "fingerprint")],
    "reference": [(runner, "reference")],
    "controls": [(runner, "plain_attention"), (runner, "plain_controls")],
    "compare": [(runner, "compare")],
}
# operators that make the host wait for the device: a scalar read, a data-dependent shape
_WAITS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero", "aten::item")
# operators that touch no data (besides the views): on a GPU they launch nothing
_NO_LAUNCH = ("aten::lift_fresh", "aten::detach", "aten::alias", "aten::scalar_tensor", "aten::empty", "aten::new_empty",
              "aten::_local_scalar_dense")


def draw_cases(backend: Backend, count: int, base_seed: int, compile_budget: float | None = 0.0) -> list[Case]:
    drawn: list[Case] = []
    plan = None if compile_budget is None else plan_variants(backend, Limits(), budget=compile_budget, seed=base_seed)
    strategy = cases(backend.capabilities, Limits()) if plan is None else plan.strategy(Limits())

    @seed(base_seed)
    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(case: Case) -> None:
        drawn.append(case)

    with seed_only_draws():  # as a campaign draws
        collect()
    return drawn[:count]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(backend: Backend, drawn: list[Case], profile: int = 0) -> tuple[float, float, int]:
    """(judge seconds, kernel-only seconds, cases judged) over ``drawn``, kernels already warm.

    With ``profile`` > 0, prints the top ``profile`` functions (cumulative time) of the timed judge pass."""
    device = backend.device or "cpu"
    supported = [case for case in drawn if backend.unsupported_reason(case) is None]
    for case in supported:  # warm-up: compiles every variant the cases need
        check_case(backend, case)
    sync(device)
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    for case in supported:
        check_case(backend, case)
    sync(device)
    judge = time.perf_counter() - start
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(profile)
    inputs = [(backend.plan(case), make_tensors(case, device)) for case in supported]
    sync(device)
    start = time.perf_counter()
    for plan, tensors in inputs:
        backend.run(plan, tensors)
    sync(device)
    return judge, time.perf_counter() - start, len(supported)


def _one_kernel_at_a_time(backend: Backend) -> Callable[[Case, int], Any]:
    """``check_case`` on ``backend`` with its kernel calls one at a time, in the cases' order (the worker's
    ``KernelLock``); the turn is given up when a case returns or raises."""
    locked = KernelLock(backend, KernelTurns(), None, lambda: None)

    def judge(case: Case, ticket: int) -> Any:
        locked.judging(NO_CASE, ticket)
        try:
            return check_case(locked, case)  # type: ignore[arg-type]
        finally:
            locked.release()
            locked.finish()

    return judge


def threaded_pass(backend: Backend, supported: list[Case], threads: int) -> tuple[float, list[tuple[str, str]]]:
    """(wall seconds, each case's (status, message)) of judging ``supported`` in ``threads`` threads,
    the kernel calls one at a time (``KernelLock``): whether the host work of
    two judged cases overlaps (torch releases the GIL in its operators) enough to be worth a design."""
    device = backend.device or "cpu"
    judge_case: Callable[[Case, int], Any] = (_one_kernel_at_a_time(backend) if threads > 1
                                              else (lambda case, _: check_case(backend, case)))
    sync(device)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        outcomes = list(pool.map(judge_case, supported, range(len(supported))))
    sync(device)
    return time.perf_counter() - start, [(o.status, o.message) for o in outcomes]


def campaign_cases(backend: Backend, drawn: list[Case]) -> list[Case]:
    """``drawn`` less the cases a campaign skips as known (a ledger class of ``backend``): through a worker
    a known failure judged beside another case is judged again alone in a fresh process (seconds each),
    which a campaign never pays for a case it skips."""
    ledger = load_ledger(GOLDEN / "ledger.json")
    versions = backend.versions()
    return [case for case in drawn if known_finding(ledger, case, backend.name, versions, backend.kernel_family) is None]


def isolated_rate(backend: Backend, drawn: list[Case], threads: int, queue: int) -> tuple[float, list[tuple[str, str]], int]:
    """(seconds, each case's (status, message), cases judged again alone) of a pass through a fresh
    worker process judging ``threads`` cases side by side, with up to ``queue`` cases queued, after a
    warm-up pass in the same process."""
    spec = isolatable(backend)
    if spec is None:
        raise SystemExit(f"{backend.name} cannot be loaded in a worker")
    isolated = IsolatedBackend(backend, spec, worker=Worker(threads=threads))
    try:
        def one_pass() -> tuple[float, list[tuple[str, str]]]:
            start, verdicts = time.perf_counter(), []
            for case in drawn:
                if isolated.pending >= queue:
                    verdicts.append(isolated.collect()[0])
                isolated.submit(case)
            while isolated.pending:
                verdicts.append(isolated.collect()[0])
            return time.perf_counter() - start, [(o.status, o.message) for o in verdicts]

        one_pass()  # warm: starts the worker, loads the backend, compiles its variants
        seconds, verdicts = one_pass()
        return seconds, verdicts, isolated.worker.rejudged
    finally:
        isolated.worker.close()


class _Stage:
    """Time and operators of the stage now running (``kernel``: the backend's own plan and run;
    ``rest``: check_case's own work); nested stages count once, in the innermost."""

    def __init__(self) -> None:
        self.stack = ["rest"]
        self.seconds: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()
        self.launches: Counter[str] = Counter()
        self.waits: Counter[str] = Counter()
        self.started = time.perf_counter()

    def enter(self, name: str, device: str) -> None:
        self._flush(device)
        self.stack.append(name)

    def leave(self, device: str) -> None:
        self._flush(device)
        self.stack.pop()

    def _flush(self, device: str) -> None:
        sync(device)
        now = time.perf_counter()
        self.seconds[self.stack[-1]] += now - self.started
        self.started = now


class _CountOps(TorchDispatchMode):
    def __init__(self, stage: _Stage) -> None:
        super().__init__()
        self.stage = stage

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name, where = f"aten::{func.__name__.split('.')[0]}", self.stage.stack[-1]
        self.stage.ops[where] += 1
        if not func.is_view and name not in _NO_LAUNCH:
            self.stage.launches[where] += 1
        if name in _WAITS or _copies_to_host(name, args, kwargs or {}):
            self.stage.waits[where] += 1
        return func(*args, **(kwargs or {}))


def _copies_to_host(name: str, args: Any, kwargs: dict) -> bool:
    """A copy from a CUDA tensor into host memory (``.cpu()``, ``.to("cpu")``, ``copy_``)."""
    on_cuda = lambda t: isinstance(t, torch.Tensor) and t.device.type == "cuda"  # noqa: E731
    if name == "aten::_to_copy":
        return on_cuda(args[0]) and torch.device(kwargs.get("device") or args[0].device).type == "cpu"
    return name == "aten::copy_" and not on_cuda(args[0]) and on_cuda(args[1])


@contextmanager
def _counting_tolist(stage: _Stage) -> Iterator[None]:
    """Count ``Tensor.tolist`` of a host tensor as a wait too (on CUDA it would be one: its copy to
    the host is counted there); it reads the data without dispatching an operator."""
    original = torch.Tensor.tolist

    def tolist(self: torch.Tensor) -> Any:
        if self.device.type != "cuda":
            stage.waits[stage.stack[-1]] += 1
        return original(self)

    torch.Tensor.tolist = tolist  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.tolist = original  # type: ignore[method-assign]


@contextmanager
def _staged(backend: Backend, stage: _Stage, device: str) -> Iterator[None]:
    """Route the stages' functions (and the backend's plan and run, as ``kernel``) through ``stage``.
    The kernel runs outside any dispatch mode: a compiled kernel (flex) cannot run under one, and
    its operators are the library's, not the judge's."""

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            stage.enter(name, device)
            try:
                if name != "kernel":
                    return fn(*args, **kwargs)
                with _disable_current_modes():
                    return fn(*args, **kwargs)
            finally:
                stage.leave(device)

        return timed

    saved: list[tuple[Any, str, Any]] = []
    targets = [(name, owner, attr) for name, found in STAGES.items() for owner, attr in found]
    targets += [("kernel", backend, "plan"), ("kernel", backend, "run")]
    for name, owner, attr in targets:
        if attr in vars(owner) or owner is backend:
            saved.append((owner, attr, vars(owner).get(attr)))
            setattr(owner, attr, wrap(name, getattr(owner, attr)))
    try:
        yield
    finally:
        for owner, attr, original in reversed(saved):
            if original is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)


def stages(backend: Backend, drawn: list[Case]) -> str:
    """A table of each stage's ms, torch operators and device waits per judged case (warm kernels)."""
    device = backend.device or "cpu"
    supported = [case for case in drawn if backend.unsupported_reason(case) is None]
    timing, counting = _Stage(), _Stage()
    with _staged(backend, timing, device):
        timing.started = time.perf_counter()
        for case in supported:
            check_case(backend, case)
        timing.leave(device)
    with _staged(backend, counting, device), _CountOps(counting), _counting_tolist(counting):
        for case in supported:
            check_case(backend, case)
    n = max(len(supported), 1)
    names = [*STAGES, "kernel", "rest"]
    lines = [f"  {'stage':<12} {'ms/case':>8} {'ops/case':>9} {'not views':>9} {'waits/case':>10}"]
    for name in [*names, "total"]:
        pick = (lambda c: sum(c.values())) if name == "total" else (lambda c: c[name])
        lines.append(
            f"  {name:<12} {pick(timing.seconds) / n * 1e3:8.2f} {pick(counting.ops) / n:9.1f} "
            f"{pick(counting.launches) / n:9.1f} {pick(counting.waits) / n:10.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-b", "--backend", action="append", required=True)
    parser.add_argument("-n", "--examples", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", default=[], help="narrow the draws, as for pa-oracle fuzz")
    parser.add_argument("--compile-budget", type=float, default=0.0,
                        help="seconds of compiles the drawn variants may cost (default 0: the built ones, at least one); -1: no restriction")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest functions of the judge pass")
    parser.add_argument("--stages", action="store_true", help="print ms, torch operators and device waits per case, by stage")
    parser.add_argument("--isolated", action="store_true",
                        help="time the cases through a worker process: one at a time against --worker-threads side by side")
    parser.add_argument("--queue", type=int, default=8, help="cases queued in the worker with --isolated (default 8)")
    parser.add_argument("--worker-threads", type=lambda text: [int(n) for n in text.split(",")], default=[2, 3], metavar="N,M",
                        help="with --isolated: the worker's judge threads to compare with one (default 2,3)")
    parser.add_argument("--threads", type=int, default=0, metavar="N",
                        help="also judge the cases in N threads (kernel calls one at a time) against 1, and compare the verdicts")
    args = parser.parse_args()
    for name in args.backend:
        backend = narrow(get_backend(name), tuple(args.only))
        if backend.unavailable_reason():
            print(f"{name}: unavailable ({backend.unavailable_reason()})")
            continue
        budget = None if args.compile_budget < 0 else args.compile_budget
        drawn = draw_cases(backend, args.examples, args.seed, budget)
        judge, kernel, judged = measure(backend, drawn, args.profile)
        print(
            f"{name} on {backend.device}: {judged} cases, {judged / judge:.1f} cases/s warm "
            f"({judge / judged * 1e3:.1f} ms a case); kernel calls alone {kernel / judged * 1e3:.2f} ms a case "
            f"-> the kernel is {kernel / judge:.1%} of the time, the oracle and checks the rest",
            flush=True,
        )
        if args.isolated:
            unknown = campaign_cases(backend, drawn)
            alone_seconds, alone, _ = isolated_rate(backend, unknown, 1, args.queue)
            judged = sum(status in ("pass", "fail") for status, _ in alone)
            rates = [f"one at a time {judged / alone_seconds:.1f} cases/s"]
            for threads in args.worker_threads:
                seconds, together, rejudged = isolated_rate(backend, unknown, threads, args.queue)
                same = sum(a == b for a, b in zip(alone, together))
                rates.append(f"{threads} side by side {judged / seconds:.1f} cases/s ({alone_seconds / seconds:.2f}x; "
                             f"the same verdict and message on {same} of {len(alone)}, {rejudged} judged again alone)")
            print(f"  through a worker, {args.queue} queued ({judged} judged, {len(drawn) - len(unknown)} known skipped): "
                  + ", ".join(rates), flush=True)
        if args.threads > 1:
            supported = [case for case in drawn if backend.unavailable_reason() is None and backend.unsupported_reason(case) is None]
            one, alone = min((threaded_pass(backend, supported, 1) for _ in range(2)), key=lambda r: r[0])
            many, together = min((threaded_pass(backend, supported, args.threads) for _ in range(2)), key=lambda r: r[0])
            same = sum(a == b for a, b in zip(alone, together))
            print(
                f"  in {args.threads} threads (kernel calls one at a time): {len(supported) / many:.1f} cases/s against "
                f"{len(supported) / one:.1f} in one -> {one / many:.2f}x; the same verdict and message on {same} of {len(supported)} cases",
                flush=True,
            )
        if args.stages:
            print(stages(backend, drawn), flush=True)


if __name__ == "__main__":
    main()
