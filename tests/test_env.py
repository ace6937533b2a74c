"""`pa-oracle env`: the table and its JSON."""

from __future__ import annotations

import json

from click.testing import CliRunner
from pa_oracle.cli import main
from pa_oracle.env import library_versions


def test_env_json_names_libraries_caches_and_the_golden_corpus(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    result = CliRunner().invoke(main, ["env", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert set(info["libraries"]) >= {"flashinfer", "flash_attn", "sglang", "triton"}
    assert all(("version" in e) != ("missing" in e) for e in info["libraries"].values()), info["libraries"]
    assert info["caches"]["triton"] == str(tmp_path / "triton")
    assert info["caches"]["flashinfer_jit"] and info["caches"]["inductor"]
    assert info["golden"]["from"] == "package data" and info["golden"]["ledger"] and info["golden"]["cases"] > 0


def test_env_table_has_a_row_per_library_cache_and_backend(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PA_ORACLE_GOLDEN", str(tmp_path / "elsewhere"))
    result = CliRunner().invoke(main, ["env"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for title in ("runtime", "kernel libraries", "caches", "golden corpus", "backends"):
        assert title in lines, title
    assert any(line.split()[:1] == ["TRITON_CACHE_DIR"] for line in lines)
    assert any("elsewhere ($PA_ORACLE_GOLDEN): MISSING" in line for line in lines)
    assert any(line.split()[:2] == ["sdpa-math", "available"] for line in lines)


def test_a_missing_library_says_why() -> None:
    assert library_versions(("no_such_kernel_library_xyz",)) == {"no_such_kernel_library_xyz": {"missing": "not installed"}}
    assert "version" in library_versions(("click",))["click"]


def test_env_shows_every_pa_oracle_setting_the_source_reads(monkeypatch) -> None:
    """Each PA_ORACLE_* variable read anywhere in the package is a row of `pa-oracle env`, with its value."""
    import re
    from pathlib import Path

    from pa_oracle.env import SETTINGS

    root = Path(__file__).resolve().parents[1]
    read = {name for room in ("oracle", "backends", "fuzz", "gates", "golden", "pa_oracle")
            for path in (root / room).rglob("*.py") if "reports" not in path.parts
            for name in re.findall(r"PA_ORACLE_[A-Z_]+[A-Z]", path.read_text())}
    assert read and read <= set(SETTINGS), f"read but not shown by `pa-oracle env`: {sorted(read - set(SETTINGS))}"
    monkeypatch.setenv("PA_ORACLE_JUDGE_THREADS", "3")
    monkeypatch.delenv("PA_ORACLE_ENGINE", raising=False)
    result = CliRunner().invoke(main, ["env"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines() if line.strip().startswith("PA_ORACLE_")}
    assert set(rows) >= set(SETTINGS), result.output
    assert rows["PA_ORACLE_JUDGE_THREADS"].split()[1] == "3" and "unset: auto" in rows["PA_ORACLE_ENGINE"]
    assert json.loads(CliRunner().invoke(main, ["env", "--json"]).output)["settings"]["PA_ORACLE_JUDGE_THREADS"] == "3"
