"""Hypothesis strategies built once for each set of arguments.

Hypothesis validates a strategy object the first time it draws from it. ``cases`` and its parts build their
sub-strategies inside each draw (the choices depend on what was drawn before), so every drawn case paid for
validating ~50 new objects: ~30% of a draw. These return one object per set of arguments instead. A
strategy's draws depend on its arguments, not on which object it is: the same seed draws the same cases.
(No numeric literals here: Hypothesis draws integers near the literals of the modules it loaded.)
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Any

from hypothesis import strategies as st

booleans = cache(st.booleans)
integers = cache(st.integers)
one_of = cache(st.one_of)
_sampled_from = cache(st.sampled_from)
_permutations = cache(st.permutations)
_lists = cache(st.lists)


def sampled_from(values: Iterable[Any]) -> Any:
    """``st.sampled_from`` of these values (a list or a tuple: the same strategy; built anew if one is unhashable)."""
    values = tuple(values)
    try:
        return _sampled_from(values)
    except TypeError:
        return st.sampled_from(values)


def permutations(values: Iterable[Any]) -> Any:
    """``st.permutations`` of these values (a range, a list or a tuple: the same strategy)."""
    return _permutations(tuple(values))


def lists(elements: Any, *, min_size: int, max_size: int) -> Any:
    """``st.lists`` of ``elements`` (a built strategy) with these sizes."""
    return _lists(elements, min_size=min_size, max_size=max_size)
