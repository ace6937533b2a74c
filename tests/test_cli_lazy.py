"""`pa-oracle` is a lazy group: its help lists every command without importing the heavy rooms."""

from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner
from pa_oracle.cli import COMMANDS, load_command, main

HEAVY = ("torch", "hypothesis", "pa_oracle.backends", "pa_oracle.fuzz.cli", "pa_oracle.gates.gsm8k", "transformers")


def _imported_after(code: str) -> list[str]:
    """The HEAVY modules a fresh interpreter has imported after running ``code``."""
    probe = f"import sys\n{code}\nprint('IMPORTED:', *(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.rsplit("IMPORTED:", 1)[1].split()


def test_importing_the_cli_and_its_help_import_neither_torch_nor_hypothesis() -> None:
    assert _imported_after("import pa_oracle.cli") == []
    help_then_exit = "from pa_oracle.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0"
    assert _imported_after(help_then_exit) == []


def test_a_commands_own_help_does_not_import_torch() -> None:
    for command in ("fuzz", "replay", "gate"):
        code = f"from pa_oracle.cli import main\ntry:\n    main([{command!r}, '--help'])\nexcept SystemExit as e:\n    assert e.code == 0"
        assert "torch" not in _imported_after(code), command


def test_help_lists_every_command_with_its_own_short_help() -> None:
    result = CliRunner().invoke(main, ["--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    listed = result.output.split("Commands:", 1)[1]
    for name, (target, short) in COMMANDS.items():
        command = load_command(target)
        assert command.get_short_help_str(limit=1000) == short, f"COMMANDS[{name!r}] is stale"
        assert f"  {name}  " in listed and short[:40] in listed, name


def test_every_command_loads_and_answers_its_help() -> None:
    for name in COMMANDS:
        result = CliRunner().invoke(main, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert f"Usage: main {name}" in result.output or f"Usage: pa-oracle {name}" in result.output, result.output
    gate = load_command(COMMANDS["gate"][0])
    assert isinstance(gate, click.Group)
    listed = CliRunner().invoke(main, ["gate", "--help"]).output
    assert all(sub in listed for sub in gate.list_commands(click.Context(gate)))


def test_an_unknown_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["fuzzz"])
    assert result.exit_code == 2 and "No such command" in result.output


def test_the_fuzz_defaults_are_the_strategies_limits() -> None:
    from pa_oracle.fuzz.cli import DEFAULT_MAX_BATCH, DEFAULT_MAX_KV_LEN
    from pa_oracle.fuzz.draw.strategies import Limits

    assert (DEFAULT_MAX_BATCH, DEFAULT_MAX_KV_LEN) == (Limits.max_batch, Limits.max_kv_len)
