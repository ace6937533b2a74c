"""``pa_oracle.api``, the one module kernel and adapter authors import: every name it lists resolves,
importing it loads no fuzzing machinery, and docs/adapters.md's examples import only from it and run."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pa_oracle import api
from pa_oracle.backends import base

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "adapters.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_every_name_in_all_resolves_and_is_listed_once():
    assert len(api.__all__) == len(set(api.__all__))
    missing = [name for name in api.__all__ if getattr(api, name, None) is None]
    assert missing == []


def test_the_names_are_the_rooms_own_objects():
    from pa_oracle.backends import writes
    from pa_oracle.oracle import reference, tolerance

    assert api.Backend is base.Backend and api.register is base.register
    assert api.register_write is writes.register and api.reference is reference.reference
    assert api.Tolerance is tolerance.Tolerance


def test_importing_it_loads_no_hypothesis_and_no_fuzz_room():
    code = ("import sys, pa_oracle.api; "
            "print(sorted(m for m in sys.modules if m == 'hypothesis' or m.startswith('pa_oracle.fuzz')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == "[]"


def test_the_docs_import_only_api_names():
    blocks = _python_blocks()
    assert len(blocks) >= 3
    imported = []
    for block in blocks:
        for line in block.splitlines():
            if m := re.match(r"\s*from (pa_oracle\S*) import (.+)", line):
                assert m[1] == "pa_oracle.api", f"docs/adapters.md imports from {m[1]}: {line.strip()}"
                imported += [name.strip() for name in m[2].split(",")]
            assert not re.match(r"\s*import pa_oracle", line), line
    assert imported and set(imported) <= set(api.__all__), sorted(set(imported) - set(api.__all__))


def test_the_docs_adapter_example_registers_and_passes_the_oracle(monkeypatch, capsys):
    """Every example that is whole Python runs, in order, in one namespace (the adapter, then the
    case judged by hand); the registration goes into a copy of the registry."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    namespace: dict[str, object] = {}
    ran = 0
    for block in _python_blocks():
        try:
            code = compile(block, str(DOC), "exec")
        except SyntaxError:
            continue  # a signature sketch (``def my_attention(...)``)
        exec(code, namespace)
        ran += 1
    assert ran >= 3 and "my-kernel" in base._REGISTRY
    verdict = namespace["verdict"]
    assert verdict.passed, verdict.headline()
    assert capsys.readouterr().out.startswith("PASS")


def test_a_spoiled_copy_of_the_docs_adapter_fails(monkeypatch):
    """The hand judgement can fail: the same adapter with a 1% larger scale."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    adapter, judge = [b for b in _python_blocks() if "MyKernel" in b]
    spoiled = adapter.replace('name = "my-kernel"', 'name = "my-spoiled-kernel"').replace("* case.sm_scale", "* case.sm_scale * 1.01")
    assert spoiled.count("1.01") == 1
    namespace: dict[str, object] = {}
    exec(compile(spoiled, "spoiled", "exec"), namespace)
    exec(compile(judge, "judge", "exec"), namespace)
    assert not namespace["verdict"].passed


@pytest.mark.parametrize("name", ["Backend", "declare", "WriteKernel", "compare"])
def test_the_module_docstring_names_what_it_exports(name):
    assert f"``{name}``" in (api.__doc__ or "")


def test_api_reexports_only_the_bottom_rooms():
    tree = ast.parse((ROOT / "pa_oracle" / "api.py").read_text())
    rooms = {node.module.split(".")[1] for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pa_oracle.")}
    assert rooms <= {"oracle", "backends"}, "the facade re-exports the bottom rooms only (no fuzz: no hypothesis)"
