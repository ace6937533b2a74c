"""Kernel adapters, one file each, found by ``discover()``: every module of this package, then
every module named by a ``pa_oracle.backends`` entry point (third-party kernels, no suite edits).
"""

from __future__ import annotations

from pa_oracle.backends.base import (
    Backend,
    Capabilities,
    KernelOutput,
    Unsupported,
    exception_text,
    import_adapters,
    register,
    registered,
)
from pa_oracle.oracle.errors import BadInput

_discovered = False


def discover() -> dict[str, type[Backend]]:
    """Import every adapter module once; return the registry."""
    global _discovered
    if not _discovered:
        _discovered = True
        import_adapters(__name__, __path__, "pa_oracle.backends")
    return registered()


def get_backend(name: str) -> Backend:
    registry = discover()
    if name not in registry:
        import difflib

        close = difflib.get_close_matches(name, registry, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown backend {name!r}{hint} (known: {', '.join(sorted(registry))})")
    return registry[name]()


class BackendSpecError(BadInput):
    """A ``-b NAME`` that is not registered or not usable here, or a ``--kernel MODULE:FUNCTION``
    that cannot be loaded."""


def available() -> tuple[list[Backend], dict[str, str]]:
    """(every registered backend usable here, {name: why not} for the rest)."""
    usable, missing = [], {}
    for name, cls in sorted(discover().items()):
        backend = cls()
        reason = backend.unavailable_reason()
        if reason:
            missing[name] = reason
        else:
            usable.append(backend)
    return usable, missing


def resolve(names: tuple[str, ...] = (), kernels: tuple[str, ...] = ()) -> list[Backend]:
    """The backends a command line names: registered ``names`` and user ``kernels`` (``MODULE:FUNCTION``);
    every usable registered backend when both are empty. Raises BackendSpecError for a name or
    kernel that cannot be used here."""
    from pa_oracle.backends.user import UserKernel

    discover()
    try:
        chosen = [get_backend(n) for n in names]
    except (KeyError, ValueError) as exc:
        raise BackendSpecError(str(exc.args[0] if exc.args else exc)) from None
    for spec in kernels:
        try:
            chosen.append(UserKernel.from_spec(spec))
        except ValueError as exc:
            raise BackendSpecError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - the user's module failed to import (ImportError, SyntaxError, its own error)
            raise BackendSpecError(f"--kernel {spec}: cannot import it ({type(exc).__name__}: {exception_text(exc)})") from None
    if not chosen:
        chosen, _ = available()
    for backend in chosen:
        reason = backend.unavailable_reason()
        if reason:
            raise BackendSpecError(f"backend {backend.name} is not available here: {reason}")
    return chosen


__all__ = ["Backend", "BackendSpecError", "Capabilities", "KernelOutput", "Unsupported", "available", "discover",
           "get_backend", "register", "resolve"]
