"""The one base class of bad input: a case file, a ledger, a campaign folder, a gate's data or an
option that the user wrote and that cannot be used. The CLI turns it into exit code 2 with its
message (which names the file and field); everything else that escapes is a tool failure."""

from __future__ import annotations

import os


class BadInput(ValueError):
    """Input the user gave is unusable; the message says which file or option and why."""


def env_count(name: str, minimum: int, error: type[BadInput], wanted: str) -> int | None:
    """The whole number >= ``minimum`` the environment variable ``name`` holds, None when it is unset or blank;
    ``error`` ("NAME='raw': give ``wanted``") when it holds anything else."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        count = int(raw)
    except ValueError:
        count = minimum - 1
    if count < minimum:
        raise error(f"{name}={raw!r}: give {wanted}")
    return count
