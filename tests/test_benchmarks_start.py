"""Every benchmark starts as the README shows it (``python benchmarks/NAME.py``): its imports resolve
and its options parse (``--help``), so a documented command never dies on an import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_benchmark_starts_as_documented(script: Path, tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage:" in run.stdout
