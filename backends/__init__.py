"""Kernel adapters, one file each, found by ``discover()``: every module of this package, then
every module named by a ``pa_oracle.backends`` entry point (third-party kernels, no suite edits).
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points

from backends.base import Backend, Capabilities, KernelOutput, Unsupported, get_backend, register, registered

_PRIVATE = {"base", "user"}
_discovered = False


def discover() -> dict[str, type[Backend]]:
    """Import every adapter module once; return the registry."""
    global _discovered
    if not _discovered:
        _discovered = True
        for module in pkgutil.iter_modules(__path__):
            if module.name not in _PRIVATE and not module.name.startswith("_"):
                importlib.import_module(f"{__name__}.{module.name}")
        for entry in entry_points(group="pa_oracle.backends"):
            entry.load()
    return registered()


__all__ = ["Backend", "Capabilities", "KernelOutput", "Unsupported", "discover", "get_backend", "register"]
