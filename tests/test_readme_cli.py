"""The README and the pages it links (``docs/*.md``, ``FINDINGS.md``) stay true: every ``pa-oracle ...``
invocation they show (code blocks and inline code) names a command whose ``--help`` works, with options
that command has (and one it shows as optional, in brackets, is not required); every ``--pa-*`` option
shown is the plugin's; every link to a file of this repository leads to one."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from pa_oracle.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), *[p for p in [ROOT / "FINDINGS.md"] if p.exists()]]
OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
PA_OPTION = re.compile(r"(?<![\w-])(--pa-[\w-]+)")


def code_lines(text: str) -> list[str]:
    """The README's code: indented and fenced blocks (continuation lines joined), and inline code spans."""
    lines, fenced, block = [], False, ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or raw.startswith("    "):
            block += raw.strip()
            if block.endswith("\\"):
                block = block[:-1] + " "
                continue
            if lines and lines[-1].startswith("pa-oracle") and block.startswith(("[", "--")) and raw.startswith("     "):
                lines[-1] += " " + block  # a usage line wrapped under its command, aligned
            else:
                lines.append(block)
            block = ""
        else:
            lines += re.findall(r"`([^`\n]+)`", raw)
    return lines


def invocations(text: str) -> list[str]:
    """Each ``pa-oracle ...`` command line, cut at a shell separator or comment."""
    found = []
    for line in code_lines(text):
        for match in re.finditer(r"(?<![\w-])pa-oracle\s+(.*)", line):
            found.append(re.split(r"\s+(?:&&|\|\||;|#)", match[1])[0].strip())  # `[-b A | -k B]` is usage, not a pipe
    return found


def _resolve(words: list[str]) -> tuple[list[str], click.Command]:
    """The subcommand path at the start of ``words`` and the command it names."""
    path, command = [], main
    ctx = click.Context(main)
    for word in words:
        if not isinstance(command, click.Group) or word not in command.list_commands(ctx):
            break
        sub = command.get_command(ctx, word)
        assert sub is not None, word
        path.append(word)
        command = sub
    return path, command


def _bracket_depths(text: str) -> list[int]:
    depth, depths = 0, []
    for char in text:
        depth += char == "["
        depths.append(depth)
        depth -= char == "]"
    return depths


INVOCATIONS = invocations(README.read_text())
PAGE_INVOCATIONS = [(page.relative_to(ROOT).as_posix(), line) for page in PAGES for line in invocations(page.read_text())]


def test_the_readme_shows_the_main_commands() -> None:
    shown = {" ".join(_resolve(line.split())[0]) for line in INVOCATIONS}
    assert {"fuzz", "replay", "env", "triage", "golden add", "metamorphic", "gate logits", "gate gsm8k"} <= shown, shown


def test_the_docs_pages_are_checked_too() -> None:
    names = {page for page, _ in PAGE_INVOCATIONS}
    assert {"README.md", "docs/cli.md", "docs/checks.md", "docs/gates.md"} <= names, names


@pytest.mark.parametrize("page, line", PAGE_INVOCATIONS)
def test_each_readme_invocation_names_a_command_and_options_it_has(page: str, line: str) -> None:
    path, command = _resolve(line.split())
    assert path, f"{page}: `pa-oracle {line}` names no command"
    result = CliRunner().invoke(main, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    params = {opt: param for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    depths = _bracket_depths(line)
    for match in OPTION.finditer(line):
        option = match[1]
        if option == "--help":
            continue
        names = option.split("/") if "/" in option else [option]
        for name in names:
            assert name in params, f"{page}: `pa-oracle {line}`: {' '.join(path)} has no option {name}"
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", result.output), f"{name} not in the help"
        param = params[names[0]]
        if depths[match.start()] > 0:
            assert not param.required, f"{page}: `pa-oracle {line}` shows the required {option} as optional"


def test_each_pytest_option_the_readme_shows_is_the_plugins() -> None:
    import pa_oracle.fuzz.plugin as plugin

    class Group:
        def __init__(self) -> None:
            self.names: list[str] = []

        def addoption(self, *names: str, **kwargs: object) -> None:
            self.names += names

    group = Group()
    plugin.pytest_addoption(type("Parser", (), {"getgroup": lambda self, *a, **k: group})())  # type: ignore[arg-type]
    assert PA_OPTION.findall(README.read_text()), "the README shows the plugin's options"
    for page in PAGES:
        shown = set(PA_OPTION.findall(page.read_text()))
        assert shown <= set(group.names), (page.name, shown - set(group.names))


def test_the_logit_gate_needs_data_and_never_defaults_to_a_folder_beside_the_checkout() -> None:
    result = CliRunner().invoke(main, ["gate", "logits", "--model", "m", "--backend", "oracle"])
    assert result.exit_code == 2 and "Missing option '--data'" in result.output, result.output


def test_every_pip_wheel_the_readme_shows_builds_no_dependencies() -> None:
    """``pip wheel .`` alone also builds every dependency (torch resolves to the newest CUDA build, ~2.9 GB)."""
    shown = re.findall(r"pip wheel[^`\n]*", README.read_text())
    assert shown, "the README shows how to build a wheel"
    assert any("pip wheel . -w dist --no-deps" in line for line in shown), shown
    everywhere = [line for page in PAGES for line in re.findall(r"pip wheel[^`\n]*", page.read_text())]
    assert all("--no-deps" in line for line in everywhere), everywhere


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_to_a_file_of_the_repository_leads_to_one(page: Path) -> None:
    targets = [t.split("#", 1)[0] for t in LINK.findall(page.read_text()) if "://" not in t and not t.startswith("#")]
    missing = [t for t in targets if t and not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to files that do not exist: {missing}"
