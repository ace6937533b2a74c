"""The gates' bad input, a ``pa_oracle.oracle.errors.BadInput`` (exit 2 from any command): a GSM8k
file, an expected-accuracy file, saved runs, a model path or a gate setting that cannot be used."""

from __future__ import annotations

from pa_oracle.oracle.errors import BadInput


class GateInputError(BadInput):
    """Bad gate input: a malformed data or expected file, runs that cannot be paired, a setting the gate cannot run."""
