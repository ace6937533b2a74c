"""KV-cache write kernels, one file each: they append tokens to a paged pool in place, and are
judged byte for byte by ``pa_oracle.oracle.append`` (the "write" kind of kernel:
``pa_oracle.backends.get_backend`` serves them as ``WriteBackend``s, and the campaign engine runs them
with the write check, ``pa_oracle.fuzz.checks.append.WRITE``). Found as attention adapters are
(``pa_oracle.backends``): every module of this package, then every module named by a
``pa_oracle.backends.writes`` entry point; a user's ``--kernel MODULE:NAME`` is loaded by the same
``load_kernel`` (``pa_oracle.backends.writes.user``)."""

from __future__ import annotations

from pa_oracle.backends.base import Backend, import_adapters
from pa_oracle.backends.writes.base import CAPABILITY_FIELDS, WRITE_SPEC, WriteBackend, WriteCapabilities, WriteKernel

ENTRY_POINTS = "pa_oracle.backends.writes"  # the entry-point group of third-party write kernels


_REGISTRY: dict[str, type[WriteKernel]] = {}
_discovered = False


def register(cls: type[WriteKernel]) -> type[WriteKernel]:
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"write kernel name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def discover() -> dict[str, type[WriteKernel]]:
    """Import every write-kernel module once (this package's, then the entry points'); the registry."""
    global _discovered
    if not _discovered:
        _discovered = True
        import_adapters(__name__, __path__, ENTRY_POINTS)
    return dict(_REGISTRY)


def get_write_kernel(name: str) -> WriteKernel:
    registry = discover()
    if name not in registry:
        raise KeyError(f"unknown write kernel {name!r} (known: {', '.join(sorted(registry))})")
    return registry[name]()


def available() -> tuple[list[WriteKernel], dict[str, str]]:
    """(every registered write kernel usable here, {name: why not} for the rest)."""
    usable, missing = [], {}
    for name, cls in sorted(discover().items()):
        kernel = cls()
        if reason := kernel.unavailable_reason():
            missing[name] = reason
        else:
            usable.append(kernel)
    return usable, missing


def resolve(names: tuple[str, ...] = (), kernels: tuple[str, ...] = ()) -> list[WriteKernel]:
    """The write kernels a command line names: registered ``names`` and user ``kernels`` (``MODULE:NAME``,
    ``pa_oracle.backends.writes.user``); every usable registered one when both are empty. Raises
    ``BackendSpecError`` (bad input) for one that cannot be used here."""
    from pa_oracle.backends.base import BackendSpecError, exception_text
    from pa_oracle.backends.writes.user import user_write_kernel

    registry = discover()
    if unknown := [n for n in names if n not in registry]:
        raise BackendSpecError(f"unknown write kernel(s) {', '.join(unknown)} (known: {', '.join(sorted(registry))})")
    chosen = [registry[n]() for n in names]
    for spec in kernels:
        try:
            chosen.append(user_write_kernel(spec))
        except (ValueError, TypeError) as exc:
            raise BackendSpecError(f"--kernel {spec}: {exception_text(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - the user's module failed to import (ImportError, SyntaxError, its own error)
            raise BackendSpecError(f"--kernel {spec}: cannot import it ({type(exc).__name__}: {exception_text(exc)})") from None
    if not chosen:
        chosen, _ = available()
    for kernel in chosen:
        if reason := kernel.unavailable_reason():
            raise BackendSpecError(f"write kernel {kernel.name} is not available here: {reason}")
    return chosen


def resolve_backends(names: tuple[str, ...] = (), kernels: tuple[str, ...] = ()) -> list[Backend]:
    """``resolve``'s kernels as the engine runs them (``WriteBackend``; a ``--kernel`` one marked the user's).
    (``pa_oracle.backends.resolve(kind="write")`` refuses an attention kernel's name first.)"""
    chosen = resolve(names, kernels)
    return [WriteBackend(k, user=i >= len(names)) if names or kernels else WriteBackend(k) for i, k in enumerate(chosen)]


def load_write_backend(spec: str) -> WriteBackend:
    """The write kernel ``WriteBackend.spec`` names (``write-kernel=NAME``: registered, or ``MODULE:NAME``), as a
    worker process loads it."""
    from pa_oracle.backends.writes.user import user_write_kernel

    name = spec.removeprefix(WRITE_SPEC)
    if ":" in name:
        return WriteBackend(user_write_kernel(name), user=True)
    return WriteBackend(get_write_kernel(name))


__all__ = ["CAPABILITY_FIELDS", "ENTRY_POINTS", "WRITE_SPEC", "WriteBackend", "WriteCapabilities", "WriteKernel", "available",
           "discover", "get_write_kernel", "load_write_backend", "register", "resolve", "resolve_backends"]
