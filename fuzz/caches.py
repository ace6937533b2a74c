"""One folder for every compile cache a run uses: FlashInfer's JIT modules, Triton's kernels, inductor's graphs.

``PA_ORACLE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/paged-attention-oracle/compile``, ``~/.cache`` when
``XDG_CACHE_HOME`` is unset) holds ``flashinfer/`` (``FLASHINFER_WORKSPACE_BASE``: FlashInfer compiles into
its ``.cache/flashinfer``), ``triton/`` (``TRITON_CACHE_DIR``) and ``inductor/`` (``TORCHINDUCTOR_CACHE_DIR``).
A variable the user set is kept. A CI job that keeps this one folder between runs (``actions/cache``)
compiles nothing a run before it compiled. The variables are set before any kernel library is imported
(``pa-oracle``'s group, the pytest plugin), so the worker processes a run starts inherit them. A cache folder
that cannot be one (it, or a folder above it, is a file) is bad input then, before anything runs: else a
backend's first compile fails inside the run, and reads as the kernel's finding or a failed build.
"""

from __future__ import annotations

import os
from pathlib import Path

from pa_oracle.oracle.errors import BadInput

CACHE_ENV = "PA_ORACLE_CACHE_DIR"
# the libraries' own variables, and the subfolder of the cache folder each one points at
LIBRARY_CACHES = {"FLASHINFER_WORKSPACE_BASE": "flashinfer", "TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor"}


def cache_dir() -> Path:
    """``PA_ORACLE_CACHE_DIR``, else ``$XDG_CACHE_HOME/paged-attention-oracle/compile``."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "paged-attention-oracle" / "compile"


class CacheDirError(BadInput):
    """The compile-cache folder cannot be a folder: the message names ``PA_ORACLE_CACHE_DIR`` and the path."""


def use_compile_caches() -> dict[str, str]:
    """Point each library's cache variable the user left unset into ``cache_dir()``; what each one is now. A
    ``CacheDirError`` when that folder, or one of them, cannot be created (a file is in the way)."""
    root = cache_dir()
    _refuse_a_file(root, root)
    for variable, sub in LIBRARY_CACHES.items():
        if not os.environ.get(variable):
            _refuse_a_file(root / sub, root)
            os.environ[variable] = str(root / sub)
    return {variable: os.environ[variable] for variable in LIBRARY_CACHES}


def _refuse_a_file(folder: Path, root: Path) -> None:
    """``CacheDirError`` when ``folder``, or the nearest existing folder above it, is not a folder."""
    existing = next((p for p in (folder, *folder.parents) if p.exists() or p.is_symlink()), None)
    if existing is None or existing.is_dir():
        return
    given = os.environ.get(CACHE_ENV)
    named = f"{CACHE_ENV}={given}" if given else f"the compile cache folder {root} ({CACHE_ENV} unset)"
    what = "a file" if existing.is_file() else "not a folder" if existing.exists() else "a broken link"
    raise CacheDirError(f"{named}: not a folder ({existing} is {what}): set {CACHE_ENV} to a folder for the "
                        "compile caches, or move the file away")
