"""Draws that depend on the seed alone.

Hypothesis (6.131 and later) also draws integers near the integer literals of every *local* module
loaded in the process: an editable install of this project, the user's own kernel module, whatever
else was imported. So the same ``--seed`` drew different cases in an editable checkout and in a wheel
install, in a process that had imported one more module, or after a new literal appeared anywhere in
the package. Inside ``seed_only_draws`` Hypothesis draws from the seed (and its own fixed constants)
only; outside it nothing changes (a user's own ``@given`` tests keep Hypothesis's default).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def seed_only_draws() -> Iterator[None]:
    """Within the block, no local-module constants in Hypothesis's draws (a no-op on a Hypothesis
    without them)."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a Hypothesis without that module has no local constants
        yield
        return
    original: Any = getattr(providers, "_get_local_constants", None)
    if original is None or not hasattr(providers, "Constants"):  # pragma: no cover - another Hypothesis
        yield
        return
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    _clear(providers)
    try:
        yield
    finally:
        providers._get_local_constants = original
        _clear(providers)


def _clear(providers: Any) -> None:
    cache = getattr(providers, "CONSTANTS_CACHE", None)  # the permitted constants per choice, local ones included
    if cache is not None and hasattr(cache, "cache"):
        cache.cache.clear()
