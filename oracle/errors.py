"""The one base class of bad input: a case file, a ledger, a campaign folder, a gate's data or an
option that the user wrote and that cannot be used. The CLI turns it into exit code 2 with its
message (which names the file and field); everything else that escapes is a tool failure."""

from __future__ import annotations


class BadInput(ValueError):
    """Input the user gave is unusable; the message says which file or option and why."""
