"""The trust boundary around a kernel call: what the judge uses is made before the call and kept where
the kernel's writes do not reach it, and what the kernel could change in the process is checked after.

- Inputs: the kernel is handed a private copy of the case's tensors and of the plan's index tensors
  (``handed``); the judge keeps the originals, computes the reference and the controls from them, and
  compares the kernel's copies with them bit for bit after the call (a tensor over ``DEVICE_COPY_LIMIT``
  bytes is kept on the host instead, and the kernel gets the original).
- The case: the kernel's side (plan and run) is handed a deep copy (``case_copy``); the judge keeps the
  case as drawn.
- torch's numerics switches (TF32, reduced-precision reductions, fp32 precisions, the default dtype,
  deterministic algorithms, SDPA backends, flushed denormals): read before the call (``numerics``), compared and put back
  after it (``restore_numerics``), before the reference and the controls are computed.
- The judge's code: every function, class and constant of the judging modules, and what that code names
  of torch's namespace, ``torch.Tensor`` (its operators too), ``torch.nn.functional``, ``pickle`` and ``builtins``, is
  recorded before the call (``Watch``); after it any rebinding, any swapped ``__code__`` or defaults, and
  any class attribute added or replaced is named, and put back, before the judge runs. (The worker's
  judge threads do both inside the kernel's turn: ``begin_turn``, ``end_turn``.)
- Ending the process: ``exit_refused`` makes ``os._exit`` during a call the kernel's crash (the write
  judge uses it; in one process a kernel's ``os._exit(0)`` would otherwise end the run with status 0).

All of this is within one process: a kernel that sets out to defeat it (reaching the judge's frames
through ``sys._getframe`` or ``gc``, patching C state) can. What it stops is a kernel whose writes or
patches would otherwise be judged as if they had not happened.
"""

from __future__ import annotations

import builtins
import copy
import operator
import os
import pickle
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.nn.functional
from pa_oracle.oracle.case import Case
from pa_oracle.oracle.tensors import Tensors, raw_bits

DEVICE_COPY_LIMIT = 1 << 30  # bytes of inputs copied on their device; past it (huge pools) they are kept on the host
COMPARE_CHUNK = 1 << 28  # bytes of a copy kept on the host moved to the device at a time to compare

# --- inputs ------------------------------------------------------------------------------------------------


@dataclass
class Handed:
    """What a kernel is handed (``tensors``, ``inputs``: the plan's index tensors) and the judge's
    copies of every element of it as it was before the call (``kept``, by name)."""

    tensors: Tensors
    inputs: dict[str, torch.Tensor]
    kept: dict[str, torch.Tensor]

    def changed(self) -> list[str]:
        """The names of the tensors whose bits the kernel changed (NaN payloads and -0.0 included)."""
        now = {**self.tensors.memory(), **self.inputs}
        return differing([(name, now[name], kept) for name, kept in self.kept.items()])


def differing(pairs: list[tuple[str, torch.Tensor, torch.Tensor]], *, batched: bool = False) -> list[str]:
    """The names of the ``(name, now, kept)`` pairs whose shape, dtype or bits differ. On the CPU (unless
    ``batched``) each is compared at once; elsewhere where ``now`` is, their flags read back together (one
    stream sync on CUDA), a copy kept on the host moved there in chunks of ``COMPARE_CHUNK`` bytes."""
    changed, flags = set(), []
    for name, t, kept in pairs:
        if t.shape != kept.shape or t.dtype != kept.dtype:
            changed.add(name)
            continue
        a, b = raw_bits(t).flatten(), raw_bits(kept).flatten()
        if a.device.type == "cpu" and b.device.type == "cpu" and not batched:  # nothing to wait for
            if not torch.equal(a, b):
                changed.add(name)
            continue
        step = max(a.numel(), 1) if b.device == a.device and not batched else max(COMPARE_CHUNK // t.element_size(), 1)
        flags += [(name, (a[i : i + step] != b[i : i + step].to(a.device)).any()) for i in range(0, a.numel(), step)]
    for device in {flag.device for _, flag in flags}:
        here = [(name, flag) for name, flag in flags if flag.device == device]
        changed.update(name for (name, _), value in zip(here, torch.stack([flag for _, flag in here]).tolist()) if value)
    return [name for name, *_ in pairs if name in changed]


def case_copy(case: Case) -> Case:
    """A deep copy of ``case`` for the kernel's side (through pickle: half the time of ``copy.deepcopy``)."""
    try:
        return pickle.loads(pickle.dumps(case, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - a meta value that does not pickle: the slower copy
        return copy.deepcopy(case)


def handed(tensors: Tensors, inputs: Mapping[str, torch.Tensor]) -> Handed:
    """A private copy of ``tensors`` to hand the kernel (the judge keeps ``tensors``), and copies of the
    plan's ``inputs`` (the adapter made them: the kernel gets them, the judge a copy to compare with).
    Inputs larger than ``DEVICE_COPY_LIMIT`` bytes (huge pools) are kept on the host and handed as they are."""
    memory = tensors.memory()
    size = sum(t.numel() * t.element_size() for t in (*memory.values(), *inputs.values()))
    if size > DEVICE_COPY_LIMIT:
        everything = {**memory, **inputs}
        return Handed(tensors, dict(inputs), {name: t.to("cpu", copy=True) for name, t in everything.items()})
    private = tensors.copy()
    return Handed(private, dict(inputs), {**memory, **{name: t.clone() for name, t in inputs.items()}})


class KernelExit(BaseException):
    """What ``os._exit`` raises during a kernel's call (``exit_refused``): the kernel's crash."""


_WORKER = {"is": False}


def in_worker() -> None:
    """Mark this process an isolated worker (``pa_oracle.fuzz.run.serve``): a kernel's ``os._exit`` ends it."""
    _WORKER["is"] = True


@contextmanager
def exit_refused() -> Iterator[None]:
    """During the block (a kernel's call), ``os._exit`` raises ``KernelExit`` instead of ending the process:
    in one process (``--no-isolate``) a kernel's ``os._exit(0)`` would end the run with exit status 0, read
    as a pass. (``posix._exit`` or a signal still end it.) In an isolated worker (``in_worker``) nothing is
    patched: the worker's death is the finding there, said by the parent, and no other thread's exit is changed."""
    if _WORKER["is"]:
        yield
        return
    real = os._exit

    def refused(status: int) -> NoReturn:
        raise KernelExit(f"the kernel called os._exit({status}) (exit code {status}; refused, the run goes on)")

    os._exit = refused
    try:
        yield
    finally:
        os._exit = real


# --- torch's numerics switches -------------------------------------------------------------------------------


def _attribute(path: str) -> tuple[Callable[[], Any], Callable[[Any], None]] | None:
    where, name = path.rsplit(".", 1)
    try:
        owner = operator.attrgetter(where)(torch) if where else torch
        getattr(owner, name)
    except (AttributeError, RuntimeError):
        return None
    return (lambda: getattr(owner, name)), (lambda value: setattr(owner, name, value))


def _deterministic() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _set_deterministic(value: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])


def _denormals_flushed() -> bool:
    """Whether this thread flushes denormals to zero (``torch.set_flush_denormal``, which has no getter)."""
    return bool((torch.tensor([1e-310], dtype=torch.float64) * 1.0).item() == 0.0)


def _flush_denormals(value: bool) -> None:
    torch.set_flush_denormal(value)


def _sdp(name: str) -> tuple[str, Callable[[], Any], Callable[[Any], None]]:
    cuda = torch.backends.cuda
    return f"torch.backends.cuda.{name}_sdp_enabled()", getattr(cuda, f"{name}_sdp_enabled"), getattr(cuda, f"enable_{name}_sdp")


def _switches() -> tuple[tuple[str, Callable[[], Any], Callable[[Any], None]], ...]:
    """(name, read, write) of each switch, in the order they are put back: the fine-grained precisions
    before the legacy flags that alias them."""
    paths = (
        "backends.fp32_precision", "backends.cuda.matmul.fp32_precision", "backends.cudnn.fp32_precision",
        "backends.cudnn.conv.fp32_precision", "backends.cudnn.rnn.fp32_precision", "backends.mkldnn.fp32_precision",
        "backends.mkldnn.matmul.fp32_precision", "backends.mkldnn.conv.fp32_precision", "backends.mkldnn.rnn.fp32_precision",
        "backends.cuda.matmul.allow_tf32", "backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
        "backends.cuda.matmul.allow_bf16_reduced_precision_reduction", "backends.cuda.matmul.allow_fp16_accumulation",
        "backends.cudnn.allow_tf32", "backends.cudnn.benchmark", "backends.cudnn.deterministic",
    )
    found = [(f"torch.{path}", *access) for path in paths if (access := _attribute(path)) is not None]
    found += [
        ("torch.get_float32_matmul_precision()", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        ("torch.get_default_dtype()", torch.get_default_dtype, torch.set_default_dtype),
        ("deterministic algorithms (enabled, warn only)", _deterministic, _set_deterministic),
        ("torch.set_flush_denormal (denormals flushed to zero)", _denormals_flushed, _flush_denormals),
    ]
    cuda = torch.backends.cuda
    sdpa = [_sdp(name) for name in ("flash", "mem_efficient", "math", "cudnn")
            if hasattr(cuda, f"{name}_sdp_enabled") and hasattr(cuda, f"enable_{name}_sdp")]  # as this torch has them
    return (*found, *sdpa)


_SWITCHES = _switches()
_UNREADABLE = "unreadable"  # a switch whose getter raises (torch refuses reading a mix of its legacy and new TF32 APIs)


def numerics() -> dict[str, Any]:
    """torch's process-wide numerics switches, by name (a getter that raises reads as unreadable)."""
    values = {}
    for name, read, _ in _SWITCHES:
        try:
            values[name] = read()
        except RuntimeError as exc:
            values[name] = f"{_UNREADABLE}: {str(exc).splitlines()[0][:80]}"
    return values


_JUDGED_WITH: Mapping[str, Any] | None = None  # the worker's switches (``judged_with``), else None
_TURN = threading.local()  # what a kernel changed in its turn, noted for its case's judge (``end_turn``)


def judged_with(saved: Mapping[str, Any]) -> Mapping[str, Any]:
    """Set the switches every case in this process is judged with (a worker's, at its start): a case's
    kernel is compared with these, not with what another thread's kernel may have set meanwhile."""
    global _JUDGED_WITH
    _JUDGED_WITH = types.MappingProxyType(dict(saved))
    return _JUDGED_WITH


def judge_numerics() -> Mapping[str, Any]:
    """The switches a case is judged with: the worker's (``judged_with``), else this process's now."""
    return _JUDGED_WITH if _JUDGED_WITH is not None else numerics()


def begin_turn(watch: Watch) -> None:
    """The start of a kernel's turn (the worker's judge threads, one kernel at a time): the judge's code
    as it is now is the record, taken while no other kernel runs."""
    _TURN.tampered, _TURN.changed = [], []
    watch.checkpoint()


def end_turn(saved: Mapping[str, Any], watch: Watch) -> None:
    """The end of a kernel's turn: what the kernel changed of the judge's code (since ``begin_turn``) and
    of ``saved`` switches is noted for this thread's ``breaches``, and put back before the next kernel's
    turn. (Read after the turn, the switches would show another thread's kernel, running by then.)"""
    if tampered := watch.tampered():
        _TURN.tampered = [*getattr(_TURN, "tampered", []), *tampered]
        watch.put_back()
    if changed := numerics_changed(saved):
        _TURN.changed = [*getattr(_TURN, "changed", []), *changed]
        restore_numerics(saved)


def numerics_changed(saved: Mapping[str, Any]) -> list[str]:
    """``name: before -> now`` of every switch that differs from ``saved``."""
    now = numerics()
    return [f"{name} {saved[name]!r} -> {now[name]!r}" for name in saved if now[name] != saved[name]]


def restore_numerics(saved: Mapping[str, Any]) -> bool:
    """Put torch's switches back as ``saved`` (some alias others: a few passes); False if they could not be."""
    for _ in range(3):
        now = numerics()
        if now == saved:
            return True
        for name, _, write in _SWITCHES:
            value = saved[name]
            if now[name] != value and not (isinstance(value, str) and value.startswith(_UNREADABLE)):
                try:
                    write(value)
                except (RuntimeError, ValueError, TypeError):
                    pass
    return numerics() == saved


# --- the judge's code ---------------------------------------------------------------------------------------


# operators the judge's code uses without naming them (``a != b``, ``a[i]``): a class's replaced one counts too
_OPERATORS = frozenset({
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__and__", "__or__", "__xor__", "__invert__", "__bool__",
    "__getitem__", "__setitem__", "__len__", "__iter__", "__contains__", "__add__", "__sub__", "__mul__", "__truediv__",
    "__floordiv__", "__mod__", "__neg__", "__abs__", "__matmul__", "__pow__",
})
_IGNORED_CLASS_KEYS = frozenset({"__slotnames__"})  # copyreg caches it on a class at its first pickle or deepcopy
_MISSING = object()
_FUNCTION_PARTS = ("__code__", "__defaults__", "__kwdefaults__")
_PART = tuple(operator.attrgetter(part) for part in _FUNCTION_PARTS)


def _library_wrapper(module: types.ModuleType, old: Any, new: Any) -> bool:
    """Whether ``new`` in place of ``old`` in a module of another library is that library's own doing, not
    a patch of the judge: a submodule imported in place of a lazy stub, or a wrapper of the very function
    (``functools.wraps``: ``__wrapped__`` leads to it), as torch.compile's first call puts around
    ``torch.manual_seed``. Never in this package's modules."""
    if _owner_name(module).startswith("pa_oracle.") or old is _MISSING or new is _MISSING:
        return False
    if isinstance(new, types.ModuleType):
        return True
    for _ in range(8):
        new = getattr(new, "__wrapped__", None)
        if new is None:
            return False
        if new is old:
            return True
    return False


def _names_used(functions: Iterable[types.FunctionType]) -> frozenset[str]:
    """Every global and attribute name the code of ``functions`` (and the code nested in it) names."""
    names: set[str] = set()
    stack = [f.__code__ for f in functions]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack += [const for const in code.co_consts if isinstance(const, types.CodeType)]
    return frozenset(names)


def _owner_name(owner: Any) -> str:
    return owner.__name__ if isinstance(owner, types.ModuleType) else f"{owner.__module__}.{owner.__qualname__}"


class Watch:
    """What the judge's code is bound to. Of this package's watched modules: every attribute by identity,
    the code object and defaults of every function (module level and in classes), and the whole
    ``__dict__`` of each class they define. Of the other modules and ``classes`` (torch's namespace,
    ``torch.Tensor``, ``builtins`` ...): the attributes this package's code names (``co_names``), an
    attribute added to a class counting too (it would shadow a base class's method). ``checkpoint``
    records the state before a kernel call (a change made outside a call, by the caller or a test's
    monkeypatch, is the judge's own); ``tampered`` names what differs after it (compared identity first,
    ~0.1 ms a case here), ``put_back`` restores it."""

    __slots__ = ("_sources", "_modules", "_classes", "_functions", "_parts")

    def __init__(self, modules: Iterable[types.ModuleType], classes: Iterable[type] = ()) -> None:
        self._sources: tuple[list[types.ModuleType], list[type]] = ([], [])
        self._modules: list[tuple[Any, tuple[str, ...], Callable[[Any], Any], Any]] = []  # (owner, names, read, values)
        self._classes: list[tuple[type, dict[str, Any]]] = []
        self._functions: list[types.FunctionType] = []
        self._parts: list[tuple[str, Callable[[Any], Any], list[types.FunctionType], list[Any]]] = []  # (part, read, functions, values)
        self.add(modules, classes)

    def add(self, modules: Iterable[types.ModuleType], classes: Iterable[type] = ()) -> None:
        """Watch ``modules`` and ``classes`` too, everything recorded as it is now (a module watched
        already, e.g. one still being imported when first recorded, is recorded anew)."""
        sources, more = self._sources[0], self._sources[1]
        sources += [module for module in modules if all(module is not known for known in sources)]
        more += [cls for cls in classes if all(cls is not known for known in more)]
        self._record()

    def _record(self) -> None:
        self._modules, self._classes = [], []
        functions: dict[int, Any] = {}
        own = [m for m in self._sources[0] if m.__name__.startswith("pa_oracle.")]
        for module in own:
            keys = tuple(name for name in vars(module) if not (name.startswith("__") and name.endswith("__")))
            getter = operator.itemgetter(*keys) if len(keys) > 1 else (lambda ns, k=keys: tuple(ns[n] for n in k))
            values = getter(vars(module))
            self._modules.append((module, keys, getter, values))
            functions.update((id(v), v) for v in values if isinstance(v, types.FunctionType))
            for cls in dict.fromkeys(v for v in values if isinstance(v, type) and v.__module__ == module.__name__):
                namespace = dict(vars(cls))
                self._classes.append((cls, namespace))
                functions.update((id(v), v) for v in namespace.values() if isinstance(v, types.FunctionType))
        self._functions = list(functions.values())
        used = _names_used(self._functions) | _OPERATORS
        # defaults matter only where there are some (a function without any gets every argument from its callers)
        self._parts = []
        for name, part in zip(_FUNCTION_PARTS, _PART):
            some = self._functions if name == "__code__" else [f for f in self._functions if part(f) is not None]
            self._parts.append((name, part, some, list(map(part, some))))
        foreign = [m for m in self._sources[0] if not m.__name__.startswith("pa_oracle.")] + list(self._sources[1])
        for owner in foreign:
            namespace = vars(owner)
            # a module: the names it has; a class: those it has through its bases too (one added would shadow them)
            keys = tuple(sorted(name for name in used if (name in namespace if isinstance(owner, types.ModuleType) else hasattr(owner, name))))
            if isinstance(owner, types.ModuleType) and len(keys) > 1:
                getter = operator.itemgetter(*keys)  # present by construction (one deleted: a KeyError, looked at closer)
            else:
                getter = (lambda ns, k=keys: tuple(ns.get(n, _MISSING) for n in k))
            self._modules.append((owner, keys, getter, getter(namespace)))

    def _same(self) -> bool:
        try:
            return (all(getter(vars(module)) == values for module, _, getter, values in self._modules)
                    and all(vars(cls) == namespace for cls, namespace in self._classes)
                    and all(list(map(part, functions)) == kept for _, part, functions, kept in self._parts))
        except Exception:  # noqa: BLE001 - a key gone, or a replaced value whose == raises: look closer
            return False

    def checkpoint(self) -> None:
        """Before a kernel call: a module attribute changed since the last record was changed by the judge's
        side (a caller, a test's monkeypatch): record everything as it is. (Only module attributes are
        compared here, half the cost of ``tampered``: nothing rebinds a class's attribute or a function's
        code between calls; one that did would be named after the next call, and put back.)"""
        try:
            same = all(getter(vars(owner)) == values for owner, _, getter, values in self._modules)
        except Exception:  # noqa: BLE001 - as in _same
            same = False
        if not same:
            self._record()

    def tampered(self) -> list[str]:
        """The qualified names of what was rebound, swapped or added since the last record."""
        if self._same():
            return []
        found, accepted = [], False
        for owner, keys, _, values in self._modules:
            namespace = vars(owner)
            for name, value in zip(keys, values):
                now = namespace.get(name, _MISSING)
                if now is value:
                    continue
                if _library_wrapper(owner, value, now):
                    accepted = True
                else:
                    found.append(f"{_owner_name(owner)}.{name}")
        for cls, namespace in self._classes:
            now = vars(cls)
            for name in (set(now) - set(namespace)) & _IGNORED_CLASS_KEYS:  # a cache of copyreg's: accepted
                namespace[name] = now[name]
            found += [f"{cls.__module__}.{cls.__qualname__}.{name}" for name in sorted(set(now) | set(namespace))
                      if now.get(name, _MISSING) is not namespace.get(name, _MISSING)]
        for name, part, functions, kept in self._parts:
            found += [f"{f.__module__}.{f.__qualname__}.{name}" for f, value in zip(functions, kept) if part(f) is not value]
        if accepted and not found:
            self._record()  # a library wrapped its own function (torch.compile's first call does): the judge's now
        return list(dict.fromkeys(found))

    def put_back(self) -> None:
        """Restore every recorded binding, code object and default; remove class attributes added since."""
        for owner, keys, _, values in self._modules:
            namespace = vars(owner)
            for name, value in zip(keys, values):
                if namespace.get(name, _MISSING) is value:
                    continue
                try:
                    if value is _MISSING:
                        delattr(owner, name)
                    else:
                        setattr(owner, name, value)
                except (AttributeError, TypeError):
                    pass
        for cls, namespace in self._classes:
            now = dict(vars(cls))
            for name in set(now) - set(namespace):
                try:
                    delattr(cls, name)
                except (AttributeError, TypeError):
                    pass
            for name, value in namespace.items():
                if now.get(name, _MISSING) is not value:
                    try:
                        setattr(cls, name, value)
                    except (AttributeError, TypeError):
                        pass
        for name, part, functions, kept in self._parts:
            for f, value in zip(functions, kept):
                if part(f) is not value:
                    setattr(f, name, value)


def judging_modules() -> list[types.ModuleType]:
    """The modules whose code judges a case (the oracle, the adapters' base, this room), as imported
    now, and torch's namespace, ``torch.nn.functional``, ``pickle`` and ``builtins``."""
    names = [name for name in sys.modules if name.startswith(("pa_oracle.oracle.", "pa_oracle.backends.base", "pa_oracle.fuzz.run."))]
    return [sys.modules[name] for name in sorted(names)] + [torch, torch.nn.functional, pickle, builtins]


def breaches(saved_numerics: Mapping[str, Any], watch: Watch, *, in_turns: bool = False) -> list[str]:
    """What a kernel call changed on the judge's side of the boundary, each put back: the judge's code
    (``watch``) and torch's numerics switches (``saved_numerics``: as before the call). ``in_turns``: the
    call ran in a turn of the worker's judge threads, whose end noted both (``end_turn``); the state now
    may be another thread's kernel's."""
    found = []
    tampered, _TURN.tampered = getattr(_TURN, "tampered", []), []
    noted, _TURN.changed = getattr(_TURN, "changed", []), []
    if not in_turns and (now := watch.tampered()):
        tampered = [*tampered, *now]
        watch.put_back()
    if tampered:
        shown = ", ".join(tampered[:6]) + (f" and {len(tampered) - 6} more" if len(tampered) > 6 else "")
        found.append(f"the kernel changed the judge: {shown} (put back; judged with the code bound before its call)")
    changed = [*noted, *([] if in_turns else numerics_changed(saved_numerics))]
    if changed:
        restored = in_turns or restore_numerics(saved_numerics)
        found.append(f"the kernel changed torch's numerics switches during its call: {', '.join(changed)} "
                     + ("(put back before the reference and the controls were computed)" if restored else "(could not be put back)"))
    return found
