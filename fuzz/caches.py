"""One folder for every compile cache a run uses: FlashInfer's JIT modules, Triton's kernels, inductor's graphs.

``PA_ORACLE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/paged-attention-oracle/compile``, ``~/.cache`` when
``XDG_CACHE_HOME`` is unset) holds ``flashinfer/`` (``FLASHINFER_WORKSPACE_BASE``: FlashInfer compiles into
its ``.cache/flashinfer``), ``triton/`` (``TRITON_CACHE_DIR``) and ``inductor/`` (``TORCHINDUCTOR_CACHE_DIR``).
A variable the user set is kept. A CI job that keeps this one folder between runs (``actions/cache``)
compiles nothing a run before it compiled. The variables are set before any kernel library is imported
(``pa-oracle``'s group, the pytest plugin), so the worker processes a run starts inherit them.
"""

from __future__ import annotations

import os
from pathlib import Path

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


def use_compile_caches() -> dict[str, str]:
    """Point each library's cache variable the user left unset into ``cache_dir()``; what each one is now."""
    root = cache_dir()
    for variable, sub in LIBRARY_CACHES.items():
        if not os.environ.get(variable):
            os.environ[variable] = str(root / sub)
    return {variable: os.environ[variable] for variable in LIBRARY_CACHES}
