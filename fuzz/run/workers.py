"""``pa-oracle fuzz --workers N``: N processes run shards 0..N-1 of one campaign (``pa_oracle.fuzz.campaign.shard``),
each pinned to one GPU with ``CUDA_VISIBLE_DEVICES`` (round-robin over the visible GPUs; on a
CPU-only machine each gets ``cpu_count // N`` OpenMP threads instead).

Work split: every worker fuzzes every selected backend on its own shard (disjoint Hypothesis
seeds and case seeds, an equal share of ``--examples``), rather than each worker taking some of
the backends: one backend then spreads over all GPUs, and no worker idles when there are fewer
backends than workers. Findings land in the one ``--out`` folder (saved by atomic rename), each
worker keeps its state in ``OUT/shards/campaign-i-of-N.json``, and the parent merges those.
The parent holds the lock on ``--out`` (``pa_oracle.fuzz.campaign.outdir``); each worker, run with ``--shard``,
locks only its own shard state.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence


def visible_gpus() -> list[str]:
    """The GPUs this process may hand out: ``CUDA_VISIBLE_DEVICES`` if set, else every CUDA device."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def assign_gpus(workers: int, gpus: Sequence[str]) -> list[str | None]:
    """Worker i gets ``gpus[i % len(gpus)]`` (None for every worker when there is no GPU).

    >>> assign_gpus(3, ["0", "1"]), assign_gpus(2, [])
    (['0', '1', '0'], [None, None])
    """
    return [gpus[i % len(gpus)] if gpus else None for i in range(workers)]


def worker_env(gpu: str | None, workers: int, base: dict[str, str]) -> dict[str, str]:
    """The environment of a worker: pinned to ``gpu``, or on CPU given its share of the cores."""
    env = dict(base)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    else:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    return env


def run_workers(args: Sequence[str], workers: int, gpus: Sequence[str], extra_env: Mapping[str, str] = {}) -> list[int]:
    """Run ``python -m pa_oracle fuzz ARGS --shard i/N`` for i in 0..N-1 side by side (``extra_env`` added to
    each one's environment); their progress
    goes to stderr, their summaries are discarded (the shard states hold them). Returns the exit
    codes, as ``pa_oracle.fuzz.exits`` defines them (0: no finding, 1: a finding, 2: bad input, 3 or
    anything else, a signal included: the worker failed)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, gpu in enumerate(assign_gpus(workers, gpus)):
            cmd = [sys.executable, "-m", "pa_oracle", "fuzz", *args, "--shard", f"{i}/{workers}", "--json"]
            procs.append(subprocess.Popen(cmd, env=worker_env(gpu, workers, {**os.environ, **extra_env}), stdout=subprocess.DEVNULL))
        return [p.wait() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:  # the parent was interrupted: stop the workers it started
                p.kill()
                p.wait()
