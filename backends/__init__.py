"""Kernel adapters, one file each, found by ``discover()``: every module of this package, then
every module named by a ``pa_oracle.backends`` entry point (third-party kernels, no suite edits).

One registry for both kinds of kernel (``Backend.kind``): attention kernels (this package) and KV-cache
write kernels (``pa_oracle.backends.writes``, entry-point group ``pa_oracle.backends.writes``), which it
holds as ``WriteBackend``s (``kind == "write"``). ``get_backend`` and ``names`` serve both; ``available``
and ``resolve`` take the kind a command runs (``fuzz``: attention, ``writes``: write): a name of the other
kind is refused by name (bad input), never routed to the other command's campaign.
"""

from __future__ import annotations

from pa_oracle.backends.base import (
    Backend,
    BackendSpecError,
    Capabilities,
    KernelOutput,
    Unsupported,
    exception_text,
    import_adapters,
    register,
    registered,
)

_discovered = False


def discover() -> dict[str, type[Backend]]:
    """Import every adapter module once; return the registry."""
    global _discovered
    if not _discovered:
        _discovered = True
        import_adapters(__name__, __path__, "pa_oracle.backends")
    return registered()


KINDS = ("attention", "write")


def names(kind: str | None = None) -> dict[str, str]:
    """{registered name: its kind} of ``kind`` (None: both), sorted by name."""
    from pa_oracle.backends.writes import discover as discover_writes

    found = {**{name: "attention" for name in discover()}, **{name: "write" for name in discover_writes()}}
    return {name: found[name] for name in sorted(found) if kind is None or found[name] == kind}


def get_backend(name: str) -> Backend:
    """The registered kernel ``name`` of either kind (a write kernel as its ``WriteBackend``)."""
    registry = discover()
    if name in registry:
        return registry[name]()
    from pa_oracle.backends.writes import WriteBackend, discover as discover_writes

    if name in (writers := discover_writes()):
        return WriteBackend(writers[name]())
    import difflib

    known = names()
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise KeyError(f"unknown backend {name!r}{hint} (known: {', '.join(known)})")



def available(kind: str | None = "attention") -> tuple[list[Backend], dict[str, str]]:
    """(every registered backend of ``kind`` usable here, {name: why not} for the rest); ``kind`` None: both
    kinds (``Backend.kind`` tells them apart), by name."""
    _check_kind(kind)
    usable, missing = [], {}
    for name in names(kind):
        backend = get_backend(name)
        reason = backend.unavailable_reason()
        if reason:
            missing[name] = reason
        else:
            usable.append(backend)
    return usable, missing


def _check_kind(kind: str | None) -> None:
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown kind of kernel {kind!r} (known: {', '.join(KINDS)})")


def resolve(names: tuple[str, ...] = (), kernels: tuple[str, ...] = (), kind: str = "attention") -> list[Backend]:
    """The backends of ``kind`` a command line names: registered ``names`` and user ``kernels``
    (``MODULE:FUNCTION``); every usable registered one of ``kind`` when both are empty. Raises
    BackendSpecError for a name or kernel that cannot be used here, or a name of the other kind."""
    from pa_oracle.backends.user import UserKernel

    _check_kind(kind)
    if kind == "write":
        from pa_oracle.backends.writes import resolve_backends

        if attention := [n for n in names if n in discover()]:
            raise BackendSpecError(f"{', '.join(attention)}: an attention kernel, not a write kernel: "
                                   f"pa-oracle fuzz -b {attention[0]} fuzzes it")
        return resolve_backends(names, kernels)
    discover()
    try:
        chosen = [get_backend(n) for n in names]
    except (KeyError, ValueError) as exc:
        raise BackendSpecError(str(exc.args[0] if exc.args else exc)) from None
    if other := [b.name for b in chosen if b.kind != kind]:
        raise BackendSpecError(f"{', '.join(other)}: a write kernel, not an attention kernel: "
                               f"pa-oracle writes -b {other[0]} fuzzes it")
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


__all__ = ["KINDS", "Backend", "BackendSpecError", "Capabilities", "KernelOutput", "Unsupported", "available", "discover",
           "get_backend", "names", "register", "resolve"]
