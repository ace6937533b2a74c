"""The pytest plugin's options refuse nonsense as pytest's usage error (exit 4, ``pytest.ExitCode.USAGE_ERROR``;
pytest's own 2 means "interrupted"), one line naming the option: never 100 examples for ``--pa-examples 0``,
a green run that skipped everything, or a failing test with a traceback (issue 31)."""

from __future__ import annotations

import pytest

from tests.test_plugin import plugin_args

pytest_plugins = ["pytester"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--pa-backend", "sdpa-math", "--pa-examples", "0"], ["--pa-examples", "expected an integer >= 1", "'0'"]),
        (["--pa-backend", "sdpa-math", "--pa-examples", "-5"], ["--pa-examples", "'-5'"]),
        (["--pa-backend", "sdpa-math", "--pa-examples", "ten"], ["--pa-examples", "'ten'"]),
        (["--pa-backend", "sdpa-math", "--pa-shards", "-1"], ["--pa-shards", "expected an integer >= 1", "'-1'"]),
        (["--pa-backend", "sdpa-math", "--pa-shards", "0"], ["--pa-shards", "'0'"]),
        (["--pa-kernel", "m:nope"], ["--pa-kernel m:nope: cannot import it", "No module named 'm'"]),
        (["--pa-kernel", "pa_oracle.fuzz.quality.planted:nope"], ["--pa-kernel pa_oracle.fuzz.quality.planted:nope", "no attribute 'nope'"]),
        (["--pa-kernel", "no_colon"], ["--pa-kernel no_colon", "MODULE:FUNCTION"]),
        (["--pa-backend", "sdpa-mat"], ["--pa-backend sdpa-mat", "did you mean sdpa-math"]),
    ],
)
def test_nonsense_plugin_options_are_usage_errors(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                  args: list[str], words: list[str]) -> None:
    from tests.test_plugin import ROOT

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *plugin_args(), *args)
    text = "\n".join(result.outlines + result.errlines)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert "Traceback" not in text and "passed" not in text and "skipped" not in text
    for word in words:
        assert word in text, (word, text)
    assert not (pytester.path / "pa-findings").exists(), "nothing ran"


def test_a_cache_dir_that_is_a_file_is_a_usage_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_plugin import ROOT

    blocking = pytester.path / "not-a-folder"
    blocking.write_text("a file\n")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("PA_ORACLE_CACHE_DIR", str(blocking))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *plugin_args(), "--pa-backend", "sdpa-math")
    text = "\n".join(result.outlines + result.errlines)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert f"PA_ORACLE_CACHE_DIR={blocking}: not a folder ({blocking} is a file)" in text and "Traceback" not in text, text
