"""Where Hypothesis keeps its files for a campaign: not in the user's working directory.

Hypothesis caches what it learns (e.g. source constants) in ``./.hypothesis``; ``pa-oracle`` and
the pytest plugin (when a ``--pa-*`` option is given) write nothing into the working directory but
their ``--out``, so the cache goes to the user's cache folder instead.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_folder() -> Path:
    """``$XDG_CACHE_HOME/paged-attention-oracle/hypothesis`` (``~/.cache`` when unset)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "paged-attention-oracle" / "hypothesis"


def keep_hypothesis_out_of_the_working_directory() -> None:
    """Point Hypothesis' home at ``cache_folder()`` unless ``HYPOTHESIS_STORAGE_DIRECTORY`` says where."""
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        return
    from hypothesis.configuration import set_hypothesis_home_dir

    set_hypothesis_home_dir(cache_folder())
