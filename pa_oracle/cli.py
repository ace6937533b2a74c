"""The ``pa-oracle`` command: the composition root, the one module that joins the rooms' commands
(fuzzing, replay, triage and golden from ``pa_oracle.fuzz``; the end-to-end gates from
``pa_oracle.gates``; ``writes``, the KV-cache write kernels; ``env`` from ``pa_oracle.env``).

The group names each command by ``module:attribute`` and imports it only when that command runs
(or its own ``--help`` is asked for): ``pa-oracle --help`` imports neither torch nor Hypothesis.
"""

from __future__ import annotations

import importlib

import click
from pa_oracle.fuzz.caches import use_compile_caches
from pa_oracle.fuzz.exits import EPILOG, ExitCodeGroup
from pa_oracle.fuzz.hypothesis_home import keep_hypothesis_out_of_the_working_directory

# name -> (where the command lives, its short help as `pa-oracle --help` lists it);
# tests/test_cli_lazy.py checks that each short help is the command's own
COMMANDS: dict[str, tuple[str, str]] = {
    "fuzz": ("pa_oracle.fuzz.cli:fuzz", "Fuzz kernels against the oracle; exit 1 on any finding."),
    "replay": ("pa_oracle.fuzz.cli:replay",
               "Re-run a saved case on one backend and print the verdict; exit 1 if it fails, 3 if no verdict "
               "(unsupported, error)."),
    "replay-compare": ("pa_oracle.fuzz.cli:replay_compare",
                       "Compare two replay --json records (e.g. two library versions): fixed / regressed / same / "
                       "new per case and backend; exit 1 if anything regressed."),
    "triage": ("pa_oracle.fuzz.triage.cli:triage",
               "Run CASE.json or FINDING_DIR on the backends, minimize it for a failing one, locate the error and "
               "write triage.md / triage.html; exit 1 if any backend fails the case."),
    "metamorphic": ("pa_oracle.fuzz.cli:metamorphic",
                    "Checks beyond output values: metamorphic relations (kernel vs kernel), plan reuse and stale "
                    "plans, CUDA-graph replay."),
    "properties": ("pa_oracle.fuzz.cli:properties",
                   "Report determinism and batch invariance per kernel (properties, not failures)."),
    "selftest": ("pa_oracle.fuzz.cli:selftest",
                 "Detection power: planted bugs found, correct kernels not flagged; exit 1 otherwise."),
    "golden": ("pa_oracle.fuzz.triage.cli:golden", "The regression corpus (golden/cases + golden/ledger.json)."),
    "gate": ("pa_oracle.gates.cli:gate",
             "End-to-end gates: a model's attention runs through a backend and is compared with a reference."),
    "writes": ("pa_oracle.fuzz.cli:writes",
               "Append ragged batches into canary-filled paged pools and compare every byte: the appended slots "
               "must hold the appended values (an fp8 cache: quantised once with the case's scale), padding rows "
               "(slot -1) nothing, and everything else must be unchanged."),
    "warmup": ("pa_oracle.fuzz.warmup:warmup",
               "Build the kernel variants a campaign (or a corpus replay) will run on, all together (FlashInfer: "
               "MAX_JOBS jobs)."),
    "env": ("pa_oracle.env:env", "Versions, devices, kernel libraries, PA_ORACLE_* settings, caches and the golden corpus in use."),
}


def load_command(target: str) -> click.Command:
    """The click command at ``module:attribute``."""
    module, _, attribute = target.partition(":")
    command = getattr(importlib.import_module(module), attribute)
    if not isinstance(command, click.Command):
        raise TypeError(f"{target} is not a click command")
    return command


class LazyGroup(ExitCodeGroup):
    """An ``ExitCodeGroup`` whose commands are imported on first use; its help lists them with the
    short help kept in ``COMMANDS`` (no import)."""

    def __init__(self, *args: object, lazy: dict[str, tuple[str, str]], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.add_command(load_command(self.lazy[cmd_name][0]), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in self.commands:
                command = self.commands[name]
                if command.hidden:
                    continue
                rows.append((name, command.get_short_help_str(limit=formatter.width - 6 - len(name))))
            else:
                rows.append((name, _short(self.lazy[name][1], formatter.width - 6 - len(name))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _short(text: str, limit: int) -> str:
    """``text`` cut at a word boundary to ``limit`` characters, as click shortens a command's help."""
    return click.Command(None, help=text).get_short_help_str(limit=max(limit, 10))


@click.group(cls=LazyGroup, lazy=COMMANDS, epilog=EPILOG)
@click.version_option(package_name="paged-attention-oracle")
def main() -> None:
    """Differential testing of paged-attention kernels against a float64 oracle."""
    keep_hypothesis_out_of_the_working_directory()
    use_compile_caches()  # one folder for FlashInfer, Triton and inductor (PA_ORACLE_CACHE_DIR), set before any import


__all__ = ["COMMANDS", "LazyGroup", "main"]
