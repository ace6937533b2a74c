"""What an adversarial user's review broke (issue 42), one test each: an empty or truncated replay record
compared as "0 regressed", campaign states that resume into an internal error, a passing write finding
replayed as no verdict, a corpus of both kinds of case refused, a compile-cache folder that is a file, and
a user's files under triage's --out replaced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from pa_oracle.fuzz.campaign.replay import Record, replay_document

from pa_oracle.cli import main

TRACEBACK = "Traceback (most recent call last)"
ENV = {"python": "3.12.0", "torch": "2.8.0", "gpu": None, "packages": {"torch": "2.8.0"}, "unavailable": {}}


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def assert_exit(result: Result, code: int, *says: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output)
    for words in says:
        assert words in result.output.replace("\n", " "), result.output
    assert TRACEBACK not in result.output


# --- 1. replay-compare of an empty or truncated record ----------------------------------------------------


def replay_record(cases: int = 2, backends: tuple[str, ...] = ("sdpa-math", "flex")) -> dict:
    rows = [Record(f"case{i}", f"c/case{i}.json", f"{i:012x}", backend, "sdpa", "pass", "", "pass", "", {"torch": "2.8.0"})
            for backend in backends for i in range(cases)]
    return json.loads(json.dumps(replay_document(rows, ENV)))


def cut_results(keep: int):  # type: ignore[no-untyped-def]
    return lambda d: d.update(results=d["results"][:keep])


@pytest.mark.parametrize("edit, says", [
    (cut_results(0), "results: empty"),
    (cut_results(3), "results: case 'case1' has no result on 'flex'"),
    (cut_results(2), "results: no result on 'flex', one of the record's backends"),
    (lambda d: d.update(results=[r for r in d["results"] if r["case"] != "case1"]), "results: no result for 'case1', one of the record's cases"),
    (lambda d: d["results"].append({**d["results"][0], "case": "case9", "case_id": "000000000009"}),
     "results[4].case: 'case9' is not among the record's cases"),
], ids=["empty", "cut in a backend", "cut after a backend", "a case left out", "a case not listed"])
def test_replay_compare_refuses_an_empty_or_truncated_record(tmp_path: Path, edit, says) -> None:  # type: ignore[no-untyped-def]
    after = replay_record()
    edit(after)
    (tmp_path / "before.json").write_text(json.dumps(replay_record()))
    (tmp_path / "after.json").write_text(json.dumps(after))
    result = cli("replay-compare", str(tmp_path / "before.json"), str(tmp_path / "after.json"))
    assert_exit(result, 2, f"{tmp_path / 'after.json'}: {says}")
    assert "regressed" not in result.output
    result = cli("replay-compare", str(tmp_path / "after.json"), str(tmp_path / "before.json"))
    assert_exit(result, 2, f"{tmp_path / 'after.json'}: {says}")


def test_replay_compare_keeps_a_whole_record_of_one_result(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps(replay_record(cases=1, backends=("sdpa-math",))))
    assert_exit(cli("replay-compare", str(tmp_path / "r.json"), str(tmp_path / "r.json")), 0, "1 same")
