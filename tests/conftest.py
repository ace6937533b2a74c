"""The project's own test settings: a Hypothesis profile for this suite (the installed pytest
plugin is inert without ``--pa-*`` options, so it sets nothing here)."""

from __future__ import annotations

import os
import signal
import warnings
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(autouse=True)
def _sigint_handler_restored(request: pytest.FixtureRequest) -> Iterator[None]:
    """Put back the SIGINT handler a test (or a library it imports) changed: the real-Ctrl-C tests need
    Python's own handler, and a child process inherits an ignored SIGINT (Python then installs none)."""
    before = signal.getsignal(signal.SIGINT)
    yield
    if signal.getsignal(signal.SIGINT) is not before:
        signal.signal(signal.SIGINT, before)
        warnings.warn(f"{request.node.nodeid} left the SIGINT handler changed (restored)", stacklevel=1)
