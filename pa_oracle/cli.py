"""The ``pa-oracle`` command: the composition root, the one module that joins the rooms' commands
(fuzzing, replay, triage and golden from ``pa_oracle.fuzz``; the end-to-end gates from
``pa_oracle.gates``)."""

from __future__ import annotations

from pa_oracle.fuzz.cli import main
from pa_oracle.fuzz.warmup import warmup
from pa_oracle.gates.cli import gate

main.add_command(gate)
main.add_command(warmup)

__all__ = ["main"]
