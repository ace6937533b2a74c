from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_conformance_suite_passes_on_a_correct_backend(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pyargs", "fuzz.test_conformance", "--pa-backend", "sdpa-math", "--pa-examples", "20")
    result.assert_outcomes(passed=1)
    assert any("pa-oracle backends:" in line for line in result.outlines)


def test_conformance_suite_fails_on_a_planted_bug_with_a_repro(pytester: pytest.Pytester, monkeypatch) -> None:
    import pathlib

    monkeypatch.setenv("PYTHONPATH", str(pathlib.Path(__file__).resolve().parents[1]))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--pyargs", "fuzz.test_conformance", "--pa-kernel", "fuzz.quality.planted:top_left_causal", "--pa-examples", "100")
    result.assert_outcomes(failed=1)
    assert any("repro: pa-oracle replay" in line for line in result.outlines)
