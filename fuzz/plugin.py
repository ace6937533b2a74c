"""pytest plugin (``pytest11`` entry point ``pa_oracle``): kernel selection options, Hypothesis
profiles, a report header with backend versions, and pytest-xdist GPU pinning.

    pytest --pyargs fuzz.test_conformance --pa-backend sdpa-math --pa-examples 300
    pytest --pyargs fuzz.test_conformance --pa-kernel my_pkg.attn:paged_attention
    pytest -n 4 --pyargs fuzz.test_conformance     # 4 workers, one GPU each, every backend in 4 shards

Under xdist the controller hands worker ``gwN`` the N-th visible GPU (round-robin) and the worker
sets ``CUDA_VISIBLE_DEVICES`` in ``pytest_configure``, before any test initializes CUDA. Seeds
belong to shards, not workers: the conformance test is parametrized over ``--pa-shards`` shards
(default: the number of xdist workers), each with its own Hypothesis and case seeds
(``fuzz.shard``), so the workers fuzz disjoint examples and a rerun draws the same ones whichever
worker gets which shard.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pa-oracle", "paged-attention oracle")
    group.addoption("--pa-backend", action="append", default=[], help="backend to fuzz (repeatable; default: all available)")
    group.addoption("--pa-kernel", action="append", default=[], help="user kernel MODULE:FUNCTION to fuzz (repeatable)")
    group.addoption("--pa-examples", type=int, default=100, help="examples per backend (default 100)")
    group.addoption("--pa-seed", type=int, default=0, help="base seed of the fuzz run (default 0)")
    group.addoption("--pa-out", default=None, help="folder for findings (default: pytest's tmp dir)")
    group.addoption("--pa-shards", type=int, default=None, help="split each backend's examples into N shards (default: xdist workers, or 1)")
    group.addoption("--pa-ledger", default=None, help="known-failure ledger whose 'matches' predicates are skipped (default: golden/ledger.json)")
    group.addoption("--pa-no-skip-known", action="store_true", help="run cases that a ledger entry already covers")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "pa_cuda_visible_devices" in workerinput:
        os.environ["CUDA_VISIBLE_DEVICES"] = workerinput["pa_cuda_visible_devices"]
    elif workerinput is None and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistGpuPinning(), "pa_oracle_gpu_pinning")
    config.addinivalue_line("markers", "gpu: needs a CUDA device")
    config.addinivalue_line("markers", "slow: compiles kernels or runs long fuzz campaigns")
    profile = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    settings.load_profile(profile)


class XdistGpuPinning:
    """Controller side: give each xdist worker one visible GPU, round-robin."""

    def __init__(self) -> None:
        self.gpus: list[str] | None = None

    def pytest_configure_node(self, node: Any) -> None:
        from fuzz.workers import assign_gpus, visible_gpus

        if self.gpus is None:
            self.gpus = visible_gpus()
        index = int(node.gateway.id.removeprefix("gw"))
        gpu = assign_gpus(index + 1, self.gpus)[index]
        if gpu is not None:
            node.workerinput["pa_cuda_visible_devices"] = gpu


def shard_count(config: pytest.Config) -> int:
    """``--pa-shards``, else one shard per xdist worker (when this process is one), else 1."""
    workerinput = getattr(config, "workerinput", None)
    return config.getoption("--pa-shards") or (int(workerinput["workercount"]) if workerinput else 1)


def selected_backends(config: pytest.Config) -> list[str]:
    """Names (backends) and MODULE:FUNCTION specs (kernels) chosen on the command line."""
    from fuzz.cli import available_backends

    chosen = list(config.getoption("--pa-backend")) + list(config.getoption("--pa-kernel"))
    return chosen or [b.name for b in available_backends()[0]]


def pytest_report_header(config: pytest.Config) -> list[str]:
    import torch

    from fuzz.cli import available_backends

    usable, missing = available_backends()
    lines = [f"pa-oracle: torch {torch.__version__}, cuda {'yes: ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'no'}"]
    lines.append("pa-oracle backends: " + ", ".join(f"{b.name}@{b.device}" for b in usable))
    if missing:
        lines.append("pa-oracle unavailable: " + "; ".join(f"{n} ({why})" for n, why in missing.items()))
    return lines
