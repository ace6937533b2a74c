"""``pa-oracle gate ...``: end-to-end accuracy gates on a real model (exit 1 when a gate fails).

Commands import ``transformers`` lazily, so ``pa-oracle`` works without it.
"""

from __future__ import annotations

import click


@click.group()
def gate() -> None:
    """End-to-end gates: a model's attention runs through a backend and is compared with a reference."""
