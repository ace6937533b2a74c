"""KV-cache write kernels, one file each: they append tokens to a paged pool in place, and are
judged byte for byte by ``pa_oracle.oracle.append`` (a backend kind of its own, with its own
registry: an attention campaign never sees these)."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from dataclasses import dataclass

from pa_oracle.oracle.append import DTYPES, LAYOUTS, AppendCase, AppendInputs


@dataclass(frozen=True)
class WriteCapabilities:
    layouts: tuple[str, ...] = LAYOUTS
    combined: tuple[bool, ...] = (False, True)  # two tensors, one [pages, 2, ...] tensor
    dtypes: tuple[str, ...] = DTYPES
    page_sizes: tuple[int, ...] = (1, 2, 5, 16)
    head_dims: tuple[int, ...] = (8, 16, 64)
    devices: tuple[str, ...] = ("cpu", "cuda")
    same_append_len: bool = False  # the API appends one length for the whole batch (flash-attn's k=)


class WriteKernel:
    """Appends ``inputs.append_k``/``append_v`` into ``inputs.pool`` in place, as its library does."""

    name: str = ""
    package: str | None = None  # the module that must import for this kernel to run
    capabilities = WriteCapabilities()

    def unavailable_reason(self) -> str | None:
        import torch

        if "cpu" not in self.capabilities.devices and not torch.cuda.is_available():
            return "needs CUDA"
        if self.package and importlib.util.find_spec(self.package) is None:
            return f"{self.package} is not installed"
        return None

    def device(self) -> str:
        import torch

        return "cuda" if torch.cuda.is_available() and "cuda" in self.capabilities.devices else "cpu"

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        raise NotImplementedError


_REGISTRY: dict[str, type[WriteKernel]] = {}


def register(cls: type[WriteKernel]) -> type[WriteKernel]:
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"write kernel name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def discover() -> dict[str, type[WriteKernel]]:
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return dict(_REGISTRY)


def get_write_kernel(name: str) -> WriteKernel:
    registry = discover()
    if name not in registry:
        raise KeyError(f"unknown write kernel {name!r} (known: {', '.join(sorted(registry))})")
    return registry[name]()
