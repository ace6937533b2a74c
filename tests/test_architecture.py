"""The import rules of ARCHITECTURE.md, checked on the source: each room imports only the rooms
below it, no module imports itself back through others (no circles), and every package folder
is installed (pyproject's ``packages``), so a wheel holds what the source tree holds."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# import name -> folder: pa_oracle/ holds the rooms as relative links (pa_oracle/oracle -> ../oracle)
PACKAGE_DIR: dict[str, str] = {"pa_oracle": "pa_oracle", **{f"pa_oracle.{room}": room
                                                          for room in ("oracle", "backends", "fuzz", "gates", "golden")}}

# room -> the rooms it may import (besides itself); a room is the longest matching prefix
BELOW: dict[str, set[str]] = {
    "pa_oracle.golden": set(),
    "pa_oracle.oracle": set(),
    "pa_oracle.backends": {"pa_oracle.oracle"},
    "pa_oracle.fuzz.draw": {"pa_oracle.oracle", "pa_oracle.backends"},
    "pa_oracle.fuzz.run": {"pa_oracle.oracle", "pa_oracle.backends", "pa_oracle.fuzz.draw"},
    "pa_oracle.fuzz.checks": {"pa_oracle.oracle", "pa_oracle.backends", "pa_oracle.fuzz.draw", "pa_oracle.fuzz.run"},
    "pa_oracle.fuzz.campaign": {"pa_oracle.oracle", "pa_oracle.backends", "pa_oracle.golden", "pa_oracle.fuzz.draw",
                                "pa_oracle.fuzz.run", "pa_oracle.fuzz.checks"},
    "pa_oracle.fuzz.triage": {"pa_oracle.oracle", "pa_oracle.backends", "pa_oracle.golden", "pa_oracle.fuzz.draw",
                              "pa_oracle.fuzz.run", "pa_oracle.fuzz.checks", "pa_oracle.fuzz.campaign"},
    "pa_oracle.fuzz.quality": {"pa_oracle.oracle", "pa_oracle.backends", "pa_oracle.fuzz.draw", "pa_oracle.fuzz.run",
                               "pa_oracle.fuzz.checks", "pa_oracle.fuzz.campaign"},
    "pa_oracle.gates": {"pa_oracle.oracle", "pa_oracle.backends", "pa_oracle.golden"},
    # the fuzz package's own modules (CLI commands, pytest plugin, conformance test) sit on its rooms
    "pa_oracle.fuzz": {"pa_oracle.oracle", "pa_oracle.backends", "pa_oracle.golden", "pa_oracle.fuzz.draw",
                       "pa_oracle.fuzz.run", "pa_oracle.fuzz.checks", "pa_oracle.fuzz.campaign",
                       "pa_oracle.fuzz.triage", "pa_oracle.fuzz.quality"},
}
# the composition root (pa_oracle/cli.py, __main__) may import every room
BELOW["pa_oracle"] = set(BELOW)


def _source_files() -> dict[str, Path]:
    """{module name: file} for every module that the package maps."""
    modules = {}
    for package, folder in PACKAGE_DIR.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("").parts
            if any(part not in PACKAGE_DIR and (base / Path(*rel[:i + 1])).is_dir()
                   and not (base / Path(*rel[:i + 1]) / "__init__.py").exists() for i, part in enumerate(rel[:-1])):
                continue  # a folder of data or tools (golden/tools), not a package
            parts = rel[:-1] if rel[-1] == "__init__" else rel
            name = ".".join((package, *parts))
            if name in PACKAGE_DIR and path.name != "__init__.py":
                continue
            modules.setdefault(name, path)
    return modules


MODULES = _source_files()


def _imports(module: str, path: Path) -> set[str]:
    """Every pa_oracle module ``module`` imports, at module level or inside functions."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES)
    return {name for name in found if name.startswith("pa_oracle") and name != module}


def room_of(module: str) -> str:
    return max((room for room in BELOW if module == room or module.startswith(room + ".")), key=len)


def test_each_room_is_a_link_in_the_package_and_nothing_maps_it_another_way():
    """pa_oracle/ROOM -> ../ROOM: mypy, editors and setuptools see one tree with one name per module."""
    for name, folder in PACKAGE_DIR.items():
        if name == "pa_oracle":
            continue
        link = ROOT / "pa_oracle" / folder
        assert link.is_symlink() and link.readlink() == Path("..", folder), f"pa_oracle/{folder} is no link to ../{folder}"
    assert "package-dir" not in PYPROJECT["tool"]["setuptools"], "a second mapping beside the links"


def test_every_package_folder_is_installed():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    folders = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert folders - listed == set(), "package folders a wheel would leave out: add them to pyproject's packages"
    assert listed - folders == set(), "pyproject lists packages that do not exist"


def test_no_old_top_level_imports():
    """Nothing imports the folders by their repository names (``import oracle``), which would load
    a second copy of a module or a user's package of the same name."""
    offenders = []
    for path in [*ROOT.glob("*/**/*.py")]:
        if ".venv" in path.parts or ".device" in path.parts or path.is_relative_to(ROOT / "build"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n.split(".")[0] in {"oracle", "fuzz", "backends", "gates", "golden"}]
    assert offenders == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_rooms_below(module):
    room = room_of(module)
    allowed = BELOW[room] | {room}
    upward = sorted(name for name in _imports(module, MODULES[module])
                    if room_of(name) not in allowed and name != "pa_oracle")
    assert upward == [], f"{module} (room {room}) imports rooms it sits below"


def test_no_import_circles():
    graph = {module: {room_module for room_module in _imports(module, path) if room_module in MODULES}
             for module, path in MODULES.items()}
    circles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles:\n" + "\n".join(circles)
