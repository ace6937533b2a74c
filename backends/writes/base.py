"""The write-kernel kind: what a write kernel declares (``WriteCapabilities``) and does (``WriteKernel``)."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from pa_oracle.backends.base import Backend
from pa_oracle.oracle.case import Case

from pa_oracle.oracle.append import CACHE_DTYPES, DTYPES, LAYOUTS, AppendCase, AppendInputs


@dataclass(frozen=True)
class WriteCapabilities:
    layouts: tuple[str, ...] = LAYOUTS
    combined: tuple[bool, ...] = (False, True)  # two tensors, one [pages, 2, ...] tensor
    dtypes: tuple[str, ...] = DTYPES  # cache dtypes; an fp8 one (oracle.append.FP8_CACHE_DTYPES) draws scales
    page_sizes: tuple[int, ...] = (1, 2, 5, 16)
    head_dims: tuple[int, ...] = (8, 16, 64)
    devices: tuple[str, ...] = ("cpu", "cuda")
    same_append_len: bool = False  # the API appends one length for the whole batch (flash-attn's k=)
    padding: bool = False  # draw padding rows (slot -1, CUDA-graph padding) that must not be stored

    def __post_init__(self) -> None:
        if bad := [d for d in self.dtypes if d not in CACHE_DTYPES]:
            raise ValueError(f"write capabilities: unknown dtype(s) {bad} (known: {', '.join(CACHE_DTYPES)})")
        if bad := [x for x in self.layouts if x not in LAYOUTS]:
            raise ValueError(f"write capabilities: unknown layout(s) {bad} (known: {', '.join(LAYOUTS)})")
        if not (self.layouts and self.combined and self.dtypes and self.page_sizes and self.head_dims):
            raise ValueError("write capabilities: layouts, combined, dtypes, page_sizes and head_dims must be non-empty")

    def replace(self, **changes: Any) -> WriteCapabilities:
        return replace(self, **changes)


CAPABILITY_FIELDS = frozenset(f.name for f in fields(WriteCapabilities))


class WriteKernel:
    """Appends ``inputs.append_k``/``append_v`` into ``inputs.pool`` in place, as its library does."""

    kind = "write"
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

    @property
    def device(self) -> str:
        import torch

        return "cuda" if torch.cuda.is_available() and "cuda" in self.capabilities.devices else "cpu"

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        raise NotImplementedError


WRITE_SPEC = "write-kernel="  # how a worker process is told to load a write kernel: ``write-kernel=NAME`` (never a module name)


class WriteBackend(Backend):
    """A write kernel as the campaign engine and the one registry (``pa_oracle.backends.get_backend``) hold it:
    ``kind`` "write", its name, device, package and versions the kernel's; judged by the write check
    (``pa_oracle.fuzz.checks.append.WRITE``), never by an attention check (every attention case is unsupported).
    ``user``: a ``MODULE:NAME`` kernel of the user's (isolated by default, named by ``--kernel`` in a repro)."""

    kind: ClassVar[str] = "write"

    def __init__(self, kernel: WriteKernel, *, user: bool = False) -> None:
        self.kernel, self.name, self.user = kernel, kernel.name, user

    @property
    def library(self) -> str | None:
        """The module that must import for the kernel to run (``WriteKernel.package``)."""
        return self.kernel.package

    def unavailable_reason(self) -> str | None:
        return self.kernel.unavailable_reason()

    @property
    def device(self) -> str | None:
        return self.kernel.device

    def versions(self) -> dict[str, str]:
        versions: dict[str, str] = {"torch": torch_version()}
        if self.kernel.package is not None:
            versions[self.kernel.package] = getattr(importlib.import_module(self.kernel.package), "__version__", "?")
        return versions

    def unsupported_reason(self, case: Case) -> str | None:
        return f"unsupported: {self.name} is a write kernel (pa-oracle writes judges it)"

    @property
    def spec(self) -> str:
        """What a worker process loads it from (``pa_oracle.fuzz.run.serve``)."""
        return WRITE_SPEC + self.name


def torch_version() -> str:
    import torch

    return str(torch.__version__)
