"""Hypothesis strategies built once for each set of arguments.

Hypothesis validates a strategy object the first time it draws from it. ``cases`` and its parts build their
sub-strategies inside each draw (the choices depend on what was drawn before), so every drawn case paid for
validating ~50 new objects: ~30% of a draw. These return one object per set of arguments instead. A
strategy's draws depend on its arguments, not on which object it is: the same seed draws the same cases.
Values are told apart by their ``repr``, not by ``==``: ``(False, True)``, ``(0, 1)`` and ``(0.0, 1.0)`` are
equal tuples but three strategies. (No numeric literals here: Hypothesis draws integers near the literals of
the modules it loaded.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

from hypothesis import strategies as st

booleans = lru_cache(maxsize=None)(st.booleans)
integers = lru_cache(maxsize=None, typed=True)(st.integers)
one_of = lru_cache(maxsize=None)(st.one_of)  # of strategies, which are equal only to themselves
_lists = lru_cache(maxsize=None, typed=True)(st.lists)
_BUILT: dict[tuple[str, str], Any] = {}


def _of_values(make: Callable[[tuple[Any, ...]], Any], values: Iterable[Any]) -> Any:
    values = tuple(values)
    key = (make.__name__, repr(values))
    if key not in _BUILT:
        _BUILT[key] = make(values)
    return _BUILT[key]


def sampled_from(values: Iterable[Any]) -> Any:
    """``st.sampled_from`` of these values (a list or a tuple: the same strategy)."""
    return _of_values(st.sampled_from, values)


def permutations(values: Iterable[Any]) -> Any:
    """``st.permutations`` of these values (a range, a list or a tuple: the same strategy)."""
    return _of_values(st.permutations, values)


def lists(elements: Any, *, min_size: int, max_size: int) -> Any:
    """``st.lists`` of ``elements`` (a built strategy) with these sizes."""
    return _lists(elements, min_size=min_size, max_size=max_size)
