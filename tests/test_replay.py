from __future__ import annotations

import json

from click.testing import CliRunner
from pa_oracle.cli import main
from pa_oracle.fuzz.campaign.replay import REPLAY_KIND, compare
from pa_oracle.oracle.case import Case, Heads, Layout


def corpus(tmp_path):
    folder = tmp_path / "cases"
    Case(Layout.from_lengths([1], [3], 4), Heads(1, 1, 8, 8)).save(folder / "a.json")
    Case(Layout.from_lengths([2, 1], [5, 0], 4), Heads(2, 1, 8, 8), seed=3).save(folder / "b.json")
    return folder


def ledger(tmp_path, versions):
    entry = {"case": "a", "backends": ["sdpa-math"], "versions": versions, "status": "tolerated", "reason": "r",
             "issue": "https://github.com/o/r/issues/1"}
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps({"schema_version": 1, "entries": [entry]}))
    return path


def document(results):
    return {"schema_version": 1, "kind": REPLAY_KIND, "environment": {"packages": {}},
            "results": [{"case": c, "backend": b, "status": s} for c, b, s in results]}


def test_compare_says_fixed_regressed_same_new_and_gone() -> None:
    before = document([("a", "k", "fail"), ("b", "k", "pass"), ("c", "k", "pass"), ("d", "k", "pass"), ("e", "k", "crash")])
    after = document([("a", "k", "pass"), ("b", "k", "crash"), ("c", "k", "pass"), ("d", "k", "unsupported"), ("f", "k", "fail")])
    kinds = {c.case: c.kind for c in compare(before, after)}
    assert kinds == {"a": "fixed", "b": "regressed", "c": "same", "d": "changed", "e": "gone", "f": "new"}


def test_a_corpus_replays_as_json_with_its_environment(tmp_path) -> None:
    out = tmp_path / "replay.json"
    result = CliRunner().invoke(main, ["replay", str(corpus(tmp_path)), "-b", "sdpa-math", "--ledger", str(ledger(tmp_path, {"torch": "0.0.1"})),
                                       "--json", "--output", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["kind"] == REPLAY_KIND and data["environment"]["packages"]["torch"]
    records = {(r["case"], r["backend"]): r for r in data["results"]}
    assert set(records) == {("a", "sdpa-math"), ("b", "sdpa-math")}
    assert records["a", "sdpa-math"]["ledger"] == "fixed" and "FIXED in torch" in records["a", "sdpa-math"]["ledger_message"]
    assert records["b", "sdpa-math"]["status"] == "pass" and records["b", "sdpa-math"]["versions"]["torch"]


def test_a_pass_inside_an_entry_s_range_fails_the_replay(tmp_path) -> None:
    import torch

    result = CliRunner().invoke(main, ["replay", str(corpus(tmp_path)), "-b", "sdpa-math", "--ledger", str(ledger(tmp_path, {"torch": torch.__version__}))])
    assert result.exit_code == 1 and ">>> a on sdpa-math: pass - passes at torch" in result.output


def test_replay_compare_exits_1_on_a_regression(tmp_path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(document([("a", "k", "fail"), ("b", "k", "pass")])))
    (tmp_path / "b.json").write_text(json.dumps(document([("a", "k", "pass"), ("b", "k", "fail")])))
    (tmp_path / "c.json").write_text(json.dumps(document([("a", "k", "pass"), ("b", "k", "pass")])))
    regressed = CliRunner().invoke(main, ["replay-compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert regressed.exit_code == 1 and "REGRESSED b on k: pass -> fail" in regressed.output and "FIXED     a on k" in regressed.output
    fixed = CliRunner().invoke(main, ["replay-compare", str(tmp_path / "a.json"), str(tmp_path / "c.json")])
    assert fixed.exit_code == 0 and "1 fixed" in fixed.output
    (tmp_path / "x.json").write_text("{}")
    bad = CliRunner().invoke(main, ["replay-compare", str(tmp_path / "a.json"), str(tmp_path / "x.json")])
    assert bad.exit_code == 2 and "not a pa-oracle replay record" in bad.output


def test_a_corpus_case_s_check_is_validated_against_the_check_names_and_its_ledger_entry(tmp_path) -> None:
    folder = corpus(tmp_path)
    a = json.loads((folder / "a.json").read_text())
    (folder / "a.json").write_text(json.dumps({**a, "meta": {"check": "mask-replan"}}))
    args = ["replay", str(folder), "-b", "sdpa-math", "--json"]
    mismatch = CliRunner().invoke(main, [*args, "--ledger", str(ledger(tmp_path, {}))])
    assert mismatch.exit_code == 2 and "the ledger entry for 'a' names check 'oracle', its golden case's meta.check is 'mask-replan'" in mismatch.output
    (folder / "a.json").write_text(json.dumps({**a, "meta": {"check": "mask-replann"}}))
    bad = CliRunner().invoke(main, [*args, "--ledger", str(ledger(tmp_path, {}))])
    assert bad.exit_code == 2 and f"{folder / 'a.json'}: meta.check: 'mask-replann' is no check; did you mean mask-replan" in bad.output
    (folder / "a.json").write_text(json.dumps({**a, "meta": {"check": "mask-replan"}}))
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"schema_version": 2, "entries": []}))
    judged = CliRunner().invoke(main, [*args, "--ledger", str(empty)])
    assert judged.exit_code == 0, judged.output
    records = {r["case"]: r for r in json.loads(judged.stdout)["results"]}
    assert records["a"]["check"] == "mask-replan" and records["a"]["status"] == "unsupported"  # sdpa-math takes no mask
    assert records["b"]["check"] == "oracle" and records["b"]["status"] == "pass"
