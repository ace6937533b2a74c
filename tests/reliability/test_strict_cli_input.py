"""Nonsense on the command line is a usage error (exit 2) that names the option, the file or the field,
before anything runs or is written: never a traceback, a campaign that cannot draw, or exit 0 (issue 31)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import pa_oracle.cli
from pa_oracle.oracle.case import Case, Heads, Layout, Options

TRACEBACK = "Traceback (most recent call last)"


def cli(*args: str) -> Result:
    return CliRunner().invoke(pa_oracle.cli.main, list(args))


def refused(result: Result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    assert TRACEBACK not in result.output
    for word in words:
        assert word in result.output, (word, result.output)


@pytest.mark.parametrize(
    ("only", "words"),
    [
        ("causal=1", ["--only causal", "true, false", "'1'"]),
        ("causal=1|0", ["--only causal", "'1|0'"]),
        ("causal=", ["--only causal=", "at least one value"]),
        ("head_dims=", ["--only head_dims=", "at least one value"]),
        ("page_sizes=0", ["--only page_sizes", "positive integers", "'0'"]),
        ("page_sizes=16,,32", ["--only page_sizes=16,,32", "empty value"]),
        ("head_dims=-64", ["--only head_dims", "positive integers"]),
        ("page_size_multiple=0", ["--only page_size_multiple", "of at least 1", "'0'"]),
        ("max_group_size=0", ["--only max_group_size", "of at least 1"]),
        ("min_qo_len=-1", ["--only min_qo_len", "non-negative integer, got '-1'"]),
        ("soft_cap_alibi_order=alibi-then-cap", ["--only cannot narrow soft_cap_alibi_order"]),
    ],
)
def test_only_refuses_values_of_the_wrong_kind(tmp_path: Path, only: str, words: list[str]) -> None:
    out = tmp_path / "out"
    refused(cli("fuzz", "-b", "sdpa-math", "-n", "2", "--only", only, "--out", str(out)), *words)
    assert not out.exists(), "refused before anything is written under --out"


def test_only_keeps_its_meaningful_forms() -> None:
    from pa_oracle.backends import get_backend
    from pa_oracle.fuzz.cli import narrow

    caps = narrow(get_backend("sdpa-math"), ("causal=true", "kv_dtypes=", "page_sizes=1,16", "head_dims=64")).capabilities
    assert caps.causal == (True,) and caps.kv_dtypes == () and caps.page_sizes == (1, 16) and caps.head_dims == (64,)
    assert narrow(get_backend("sdpa-math"), ("causal=false,true",)).capabilities.causal == (False, True)


def _case_file(folder: Path, meta: dict) -> Path:
    case = Case(Layout((0, 2), (0, 1), (0,), (3,), 4, 1), Heads(2, 1, 16, 16), Options(causal=True), seed=1)
    data = case.to_json()
    data["meta"] = meta
    path = folder / "case.json"
    path.write_text(json.dumps(data))
    return path


def test_replay_without_backend_runs_on_the_backend_that_found_the_case(tmp_path: Path) -> None:
    result = cli("replay", str(_case_file(tmp_path, {"found_by": "pa-oracle fuzz", "backend": "sdpa-math", "kernel": None})), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["backend"] == "sdpa-math"


def test_replay_without_backend_reads_a_golden_cases_found_by(tmp_path: Path) -> None:
    result = cli("replay", str(_case_file(tmp_path, {"found_by": {"backend": "sdpa-math", "kernel": None}})), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["backend"] == "sdpa-math"


def test_replay_never_imports_the_kernel_a_case_file_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """meta.kernel names a module that would leave a mark if imported: replay refuses and says to pass --kernel."""
    mark = tmp_path / "imported"
    (tmp_path / "evil_kernel_module.py").write_text(
        f"open({str(mark)!r}, 'w').write('ran')\ndef attend(*a, **k):\n    raise SystemExit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    case = _case_file(tmp_path, {"backend": "evil_kernel_module:attend", "kernel": "evil_kernel_module:attend"})
    refused(cli("replay", str(case)), "user kernel evil_kernel_module:attend", "pass --kernel evil_kernel_module:attend")
    assert not mark.exists(), "the module a case file names was imported"


def test_replay_of_a_case_that_names_no_backend_asks_for_one(tmp_path: Path) -> None:
    refused(cli("replay", str(_case_file(tmp_path, {}))), "names no backend", "--backend")
    refused(cli("replay", str(_case_file(tmp_path, {"backend": 7}))), "meta.backend", "got int 7")  # the record's reader


def test_replay_output_into_a_missing_folder_is_refused_before_replaying(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pa_oracle.fuzz.campaign.replay as corpus

    ran: list[object] = []
    monkeypatch.setattr(corpus, "replay_corpus", lambda *a, **k: ran.append(a) or [])
    case = _case_file(tmp_path, {"backend": "sdpa-math"})
    missing = tmp_path / "no" / "such" / "record.json"
    refused(cli("replay", str(case), str(case), "-b", "sdpa-math", "--output", str(missing)), "--output", str(missing.parent))
    refused(cli("replay", str(case), "--output", str(missing)), "--output")
    assert not ran and not missing.parent.exists()
