"""pytest plugin (``pytest11`` entry point ``pa_oracle``): kernel selection options, Hypothesis
profiles and a report header with backend versions.

    pytest --pyargs fuzz.test_conformance --pa-backend sdpa-math --pa-examples 300
    pytest --pyargs fuzz.test_conformance --pa-kernel my_pkg.attn:paged_attention
"""

from __future__ import annotations

import os

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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device")
    config.addinivalue_line("markers", "slow: compiles kernels or runs long fuzz campaigns")
    profile = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    settings.load_profile(profile)


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
