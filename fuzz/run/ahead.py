"""Host tensors drawn ahead: while a worker judges one case, a background thread draws the host half
of the next queued case's tensors (its float64 ``randn`` from the seed and the casts:
``host_draw``), the largest host cost of a judged case the device does not wait on, and its
oracle's bucket plan (``host_plan``, numpy). torch's operators release the GIL, so the draw runs
beside the judge.

The values are exactly ``make_tensors``' (the same ``host_draw`` makes them). A draw is used only
for a case with its ``draw_key`` and only once; one prepared for a case that is never judged
(skipped, crashed, dropped with its worker) is dropped when a later case is taken.
The worker draws ahead for a backend on an accelerator (the judge there is one host thread
launching work, the other cores idle); on the CPU the judge's own operators already use every
core, so a second thread would only compete with them. ``PA_ORACLE_DRAW_AHEAD=1`` draws ahead for
every backend, ``0`` for none (what ``benchmarks/fuzz_rate.py`` compares against).
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import torch

from pa_oracle.oracle.buckets import HostPlan, host_plan
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import HostDraw, draw_key, host_draw

KEPT = 4  # draws prepared and not taken that are kept (the worker prepares the next one or two)


def mode_from_env() -> str:
    """``PA_ORACLE_DRAW_AHEAD``: "off" for ``0``/``false``/``no``/``off``, "on" for ``1``/``true``/``yes``/``on``,
    else "auto" (unset: accelerator backends only)."""
    raw = os.environ.get("PA_ORACLE_DRAW_AHEAD", "").strip().lower()
    return "off" if raw in ("0", "false", "no", "off") else "on" if raw in ("1", "true", "yes", "on") else "auto"


class DrawAhead:
    """Draws prepared in one background thread, in the order asked, each for one case (a case
    prepared twice, e.g. two queued cases differing only in a mask option, is drawn twice)."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.mode = mode_from_env() if enabled is None else "on" if enabled else "off"
        self._executor: ThreadPoolExecutor | None = None
        self._prepared: deque[tuple[tuple, Future[_Prepared]]] = deque()  # (draw_key, its draw), oldest first
        self._taken: _Prepared | None = None  # what ``take`` last gave a draw from (its plan for ``take_plan``)
        self.taken = 0  # cases that got a prepared draw (for tests and benchmarks)

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self.mode = "on" if value else "off"

    def wanted(self, device: str | None) -> bool:
        """Whether a worker should draw ahead for a backend on ``device`` (None: the CPU)."""
        return self.mode == "on" or (self.mode == "auto" and (device or "cpu") != "cpu")

    def prepare(self, case: Case, device: str | None = None) -> None:
        """Start drawing ``case``'s host tensors, and planning its buckets for ``device`` (None:
        the CPU), in the background (nothing for a sidecar case)."""
        if not self.enabled or case.tensors_file is not None:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pa-oracle-draw-ahead")
        device_type = torch.device(device or "cpu").type
        self._prepared.append((draw_key(case), self._executor.submit(_prepare, case, device_type)))
        while len(self._prepared) > KEPT:
            self._prepared.popleft()[1].cancel()  # if not started yet, never made

    def take(self, case: Case) -> HostDraw | None:
        """The draw prepared for ``case`` (waiting for it if it is still being made), or None: none
        was, or making it raised (the caller draws directly, and meets the error where it belongs).
        Draws prepared before it are dropped: their cases were passed over."""
        if not self._prepared or case.tensors_file is not None:
            return None
        key = draw_key(case)
        if all(prepared != key for prepared, _ in self._prepared):
            return None
        while True:
            prepared, future = self._prepared.popleft()
            if prepared == key:
                break
            future.cancel()
        try:
            prepared = future.result()
        except Exception:  # noqa: BLE001 - the direct draw raises it again, in the case's own judge
            return None
        self.taken += 1
        self._taken = prepared
        return prepared.draw

    def take_plan(self, case: Case) -> HostPlan | None:
        """The host bucket plan prepared with the draw ``take`` last gave, if that was for this
        very ``case`` object (the plan reads options a draw does not), else None."""
        taken, self._taken = self._taken, None
        return taken.plan if taken is not None and taken.case is case else None

    def clear(self) -> None:
        """Drop every prepared draw."""
        self._taken = None
        while self._prepared:
            self._prepared.popleft()[1].cancel()

    @property
    def prepared(self) -> int:
        """Draws prepared and not taken."""
        return len(self._prepared)


class _Prepared(NamedTuple):
    case: Case  # the case object it was prepared for (another with its draw key shares the draw only)
    draw: HostDraw
    plan: HostPlan | None  # None for a custom-mask case (planned one request at a time)


def _prepare(case: Case, device_type: str) -> _Prepared:
    return _Prepared(case, host_draw(case), None if case.custom_mask is not None else host_plan(case, device_type))


AHEAD = DrawAhead()  # the process's draws ahead: the worker prepares, ``check_case`` takes
