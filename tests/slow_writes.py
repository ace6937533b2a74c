"""A correct write kernel that takes its time (tests/test_write_budget.py): each write sleeps ``SECONDS``."""

from __future__ import annotations

import time

SECONDS = 0.4


def slow_but_correct(key, value, k_cache, v_cache, *, slot_mapping) -> None:  # type: ignore[no-untyped-def]
    time.sleep(SECONDS)
    rows = slot_mapping >= 0
    page_size = k_cache.shape[1]
    pages, slots = slot_mapping[rows] // page_size, slot_mapping[rows] % page_size
    k_cache[pages, slots] = key[rows].to(k_cache.dtype)
    v_cache[pages, slots] = value[rows].to(v_cache.dtype)
