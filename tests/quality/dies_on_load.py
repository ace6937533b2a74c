"""A user kernel module that imports in the campaign but kills the worker process that loads it."""

from __future__ import annotations

import multiprocessing
import os

if multiprocessing.parent_process() is not None:
    os._exit(3)

from tests.reliability.bad_kernels import correct as kernel  # noqa: E402,F401
