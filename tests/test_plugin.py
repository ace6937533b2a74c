from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


def plugin_args() -> list[str]:
    """``-p pa_oracle.fuzz.plugin`` where the package is not installed (the plugin is then not an entry point)."""
    installed = any(ep.name == "pa_oracle" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "pa_oracle.fuzz.plugin"]


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def test_conformance_suite_passes_on_a_correct_backend(pytester: pytest.Pytester, on_path) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *plugin_args(), "--pyargs", "pa_oracle.fuzz.test_conformance",
                                           "--pa-backend", "sdpa-math", "--pa-examples", "20")
    result.assert_outcomes(passed=1)
    assert any("pa-oracle: torch" in line and "sdpa-math" in line for line in result.outlines)


def test_conformance_suite_fails_on_a_planted_bug_with_a_repro_and_keeps_the_report(pytester: pytest.Pytester, on_path) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *plugin_args(),
                                           "--pa-kernel", "pa_oracle.fuzz.quality.planted:top_left_causal", "--pa-examples", "100")
    result.assert_outcomes(failed=1)
    assert any("repro: pa-oracle replay" in line for line in result.outlines)
    assert any("test_kernel_agrees_with_oracle[pa_oracle.fuzz.quality.planted:top_left_causal]" in line for line in result.outlines)
    reports = list((pytester.path / "pa-findings").rglob("report.md"))
    assert reports, "the finding is saved under ./pa-findings (pytest's tmp dirs are deleted)"


def test_pa_kernel_alone_collects_the_conformance_test(pytester: pytest.Pytester, on_path) -> None:
    pytester.makepyfile(test_theirs="def test_theirs():\n    assert True\n")
    alone = pytester.runpytest_subprocess("-p", "no:cacheprovider", *plugin_args(), "--collect-only", "-q",
                                          "--pa-kernel", "pa_oracle.fuzz.quality.planted:correct_attention")
    assert any(line == "test_conformance.py::test_kernel_agrees_with_oracle[pa_oracle.fuzz.quality.planted:correct_attention]"
               for line in alone.outlines), alone.outlines  # named by its file, not an empty path ("::test_...")
    everything = pytester.runpytest_subprocess("-p", "no:cacheprovider", *plugin_args(), "--collect-only", "-q",
                                               "-o", "python_files=*.py", "--pa-kernel",
                                               "pa_oracle.fuzz.quality.planted:correct_attention")
    collected = [line for line in everything.outlines if "::" in line]
    assert len(collected) == 1 and "test_conformance.py::" in collected[0], "the package's other modules are no tests"
    assert not any("test_theirs" in line for line in alone.outlines), "with no path named, only the conformance test runs"
    beside = pytester.runpytest_subprocess("-p", "no:cacheprovider", *plugin_args(), "--collect-only", "-q",
                                           "--pa-backend", "sdpa-math", "test_theirs.py")
    names = "\n".join(beside.outlines)
    assert "test_theirs.py::test_theirs" in names and "test_kernel_agrees_with_oracle[sdpa-math]" in names


def test_the_plugin_is_inert_without_pa_options(pytester: pytest.Pytester, on_path) -> None:
    """A project with its own Hypothesis profile keeps it; no kernel library or registry is imported."""
    pytester.makeconftest(
        """
        from hypothesis import settings
        settings.register_profile("theirs", max_examples=7, deadline=1234)
        settings.load_profile("theirs")
        """
    )
    pytester.makepyfile(
        test_own="""
        import os
        import sys

        from hypothesis import settings

        def test_profile_and_imports():
            assert settings().max_examples == 7
            assert settings().deadline.total_seconds() * 1000 == 1234
            assert "backends" not in sys.modules and "torch" not in sys.modules
            assert "pa_oracle.fuzz.cli" not in sys.modules
            assert os.environ.get("CUDA_VISIBLE_DEVICES") == "3,4"
        """
    )
    os.environ["CUDA_VISIBLE_DEVICES"] = "3,4"
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *plugin_args(), "test_own.py")
    finally:
        del os.environ["CUDA_VISIBLE_DEVICES"]
    result.assert_outcomes(passed=1)
    assert not any("pa-oracle" in line for line in result.outlines), "no header line"
