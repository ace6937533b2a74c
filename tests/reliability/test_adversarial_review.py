"""What an adversarial user's review broke (issue 42), one test each: an empty or truncated replay record
compared as "0 regressed", campaign states that resume into an internal error, a passing write finding
replayed as no verdict, a corpus of both kinds of case refused, a compile-cache folder that is a file, and
a user's files under triage's --out replaced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from pa_oracle.fuzz.campaign.replay import Record, replay_document
from pa_oracle.oracle.case import Case, Heads, Layout, Options

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


# --- 2. fuzz --resume of a finding record without its optional check, or with a malformed one --------------

GQA_BUG = "pa_oracle.fuzz.quality.planted:wrong_gqa_map"
TINY = ["--max-batch", "2", "--max-kv-len", "12"]


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("found") / "out"
    assert_exit(cli("fuzz", "-k", GQA_BUG, "-n", "30", *TINY, "--out", str(out)), 1, "FINDING in")
    return out


def edited_campaign(found: Path, tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    shutil.copytree(found, out)
    data = json.loads((out / "campaign.json").read_text())
    for result in data["backends"].values():
        for finding in result["findings"]:
            edit(finding)
    (out / "campaign.json").write_text(json.dumps(data))
    return out


def test_resume_reads_a_finding_record_written_before_it_had_a_check(found: Path, tmp_path: Path) -> None:
    out = edited_campaign(found, tmp_path, lambda f: f.pop("check"))
    assert_exit(cli("fuzz", "--resume", "-n", "40", "--out", str(out)), 1, "FINDING in")
    [result] = json.loads((out / "campaign.json").read_text())["backends"].values()
    assert [f["check"] for f in result["findings"]] == ["oracle"]


@pytest.mark.parametrize("check, says", [
    ("", "findings[0].check: expected str of length >= 1"),
    ("determinism", "findings[0].check: 'determinism', but the result is the oracle's (its check)"),
    ("no-such-check", "findings[0].check: 'no-such-check', but the result is the oracle's (its check)"),
    (5, "findings[0].check: expected str, got int 5"),
])
def test_resume_refuses_a_malformed_finding_check_by_name(found: Path, tmp_path: Path, check: object, says: str) -> None:
    out = edited_campaign(found, tmp_path, lambda f: f.update(check=check))
    before = (out / "campaign.json").read_text()
    result = cli("fuzz", "--resume", "-n", "40", "--out", str(out))
    assert_exit(result, 2, f"{out / 'campaign.json'}: malformed campaign state: backends.{GQA_BUG}.{says}")
    assert (out / "campaign.json").read_text() == before


# --- 3. writes / metamorphic --resume of a state whose config.checks is not its kind's ---------------------


@pytest.fixture(scope="module")
def check_campaigns(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checks")
    assert_exit(cli("writes", "-b", "torch-scatter", "-n", "3", "--no-isolate", "--out", str(root / "writes")), 0)
    assert_exit(cli("metamorphic", "-b", "sdpa-math", "-c", "reorder", "-n", "2", "--out", str(root / "metamorphic")), 0)
    assert_exit(cli("fuzz", "-b", "sdpa-math", "-n", "2", *TINY, "--out", str(root / "fuzz")), 0)
    return {"writes": root / "writes" / "writes-state.json", "metamorphic": root / "metamorphic" / "checks.json",
            "fuzz": root / "fuzz" / "campaign.json"}


NOT_ITS_CHECKS = [
    ("writes", [], "config.checks: expected array of length >= 1"),
    ("writes", "write", "config.checks: expected list, got str"),
    ("writes", [5], "config.checks[0]: expected str, got int 5"),
    ("writes", ["nope"], "config.checks[0]: 'nope' is no check"),
    ("writes", ["reorder"], "config.checks: ['reorder'], but writes-state.json holds a write campaign (the write check alone)"),
    ("writes", ["write", "write"], "config.checks[1]: 'write' again"),
    ("metamorphic", [], "config.checks: expected array of length >= 1"),
    ("metamorphic", "reorder", "config.checks: expected list, got str"),
    ("metamorphic", ["write"], "config.checks[0]: 'write' judges write kernels: its campaign is kept in writes-state.json"),
    ("metamorphic", ["reordr"], "config.checks[0]: 'reordr' is no check; did you mean reorder?"),
    ("fuzz", ["reorder"], "config.checks: ['reorder'], but campaign.json holds the oracle comparison's campaign"),
]


@pytest.mark.parametrize("command, checks, says", NOT_ITS_CHECKS, ids=[f"{c} {json.dumps(v)}" for c, v, _ in NOT_ITS_CHECKS])
def test_resume_refuses_checks_that_are_not_the_campaigns_by_name(check_campaigns: dict[str, Path], tmp_path: Path,
                                                                  command: str, checks: object, says: str) -> None:
    out = tmp_path / "out"
    shutil.copytree(check_campaigns[command].parent, out)
    state = out / check_campaigns[command].name
    data = json.loads(state.read_text())
    data["config"]["checks"] = checks
    state.write_text(json.dumps(data))
    result = cli(command, "--resume", "-n", "4", "--out", str(out))
    assert_exit(result, 2, f"{state}: malformed campaign state: {says}")
    assert json.loads(state.read_text()) == data


# --- 4. replay of a write finding on a kernel that passes it --------------------------------------------

WRITE_BUG = "pa_oracle.fuzz.quality.planted_writes:OneSlotPast"


@pytest.fixture(scope="module")
def write_finding(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("writes") / "out"
    assert_exit(cli("writes", "--kernel", WRITE_BUG, "-n", "50", "--no-isolate", "--out", str(out)), 1, " FAIL fail ")
    return next(out.glob("*/writes.json"))


def test_replay_of_a_write_finding_on_a_kernel_that_passes_it_is_a_pass(write_finding: Path) -> None:
    assert_exit(cli("replay", str(write_finding), "-b", "torch-scatter"), 0, "torch-scatter: PASS: ")
    assert_exit(cli("replay", str(write_finding.parent), "--kernel", "pa_oracle.fuzz.quality.planted_writes:PerTokenLoop"),
                0, "PerTokenLoop: PASS: ")
    assert_exit(cli("replay", str(write_finding), "--kernel", WRITE_BUG), 1, "OneSlotPast: FAIL: ")


# --- 6. a corpus folder holding an attention case and a write case ----------------------------------------


@pytest.fixture
def both_kinds(tmp_path: Path, write_finding: Path) -> Path:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    Case(Layout((0, 2), (0, 1), (0,), (3,), 4, 1), Heads(2, 1, 16, 16), Options(causal=True), seed=1).save(corpus / "attn.json")
    shutil.copy(write_finding, corpus / "writes.json")
    return corpus


def test_a_corpus_of_both_kinds_replays_each_case_on_the_kernels_of_its_kind(both_kinds: Path, tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    result = cli("replay", str(both_kinds), "-b", "sdpa-math", "-b", "torch-scatter", "--output", str(record))
    assert_exit(result, 0, "attn on sdpa-math: pass", "writes on torch-scatter (write): pass",
                "replayed 2 cases on 2 backends: 2 pass")
    rows = [(r["case"], r["backend"], r["check"], r["status"]) for r in json.loads(record.read_text())["results"]]
    assert sorted(rows) == [("attn", "sdpa-math", "oracle", "pass"), ("writes", "torch-scatter", "write", "pass")]
    assert_exit(cli("replay-compare", str(record), str(record)), 0, "0 regressed, 0 fixed, 2 same")
    result = cli("replay", str(both_kinds / "attn.json"), str(both_kinds / "writes.json"), "-b", "sdpa-math", "-b", "torch-scatter")
    assert_exit(result, 0, "replayed 2 cases on 2 backends: 2 pass")


def test_a_corpus_of_both_kinds_says_which_file_no_kernel_given_judges(both_kinds: Path) -> None:
    result = cli("replay", str(both_kinds), "-b", "sdpa-math")
    assert_exit(result, 2, f"{both_kinds / 'writes.json'}: a write case, but no write kernel was given (-b sdpa-math)")
    result = cli("replay", str(both_kinds), "-b", "torch-scatter")
    assert_exit(result, 2, f"{both_kinds / 'attn.json'}: an attention case, but no attention kernel was given (-b torch-scatter)")
    result = cli("replay", str(both_kinds), "-b", "torch-scatter", "--kernel", "pa_oracle.fuzz.quality.planted:correct_attention")
    assert_exit(result, 2, "--kernel", f"{both_kinds / 'attn.json'}", f"{both_kinds / 'writes.json'}")


def test_warmup_of_a_corpus_of_both_kinds_builds_its_attention_cases(both_kinds: Path) -> None:
    result = cli("warmup", "--corpus", str(both_kinds), "-b", "sdpa-math")
    assert_exit(result, 0, f"{both_kinds / 'writes.json'}: a write case: nothing to build ahead", "built in ")


# --- 7. PA_ORACLE_CACHE_DIR naming a file -----------------------------------------------------------------


@pytest.mark.parametrize("command", [
    ["env"], ["env", "--json"], ["fuzz", "-b", "flex", "-n", "3", *TINY], ["warmup", "-b", "flex", "--variants", "1"],
    ["writes", "-b", "torch-scatter", "-n", "3"], ["replay", "golden/cases/regress-page-1.json", "-b", "flex"],
], ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("under", [False, True], ids=["the file", "a folder under it"])
def test_a_cache_dir_that_is_a_file_is_bad_input_before_anything_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      command: list[str], under: bool) -> None:
    blocking = tmp_path / "not-a-folder"
    blocking.write_text("a file\n")
    given = blocking / "compile" if under else blocking
    monkeypatch.setenv("PA_ORACLE_CACHE_DIR", str(given))
    monkeypatch.chdir(Path(__file__).parents[2])  # (the golden case's relative path)
    out = ["--out", str(tmp_path / "out")] if command[0] in ("fuzz", "writes") else []
    result = cli(*command, *out)
    assert_exit(result, 2, f"PA_ORACLE_CACHE_DIR={given}: not a folder ({blocking} is a file)")
    assert not (tmp_path / "out").exists() and blocking.read_text() == "a file\n"


# --- 8. nothing a user wrote under triage's --out (or in ISSUE.md) is lost ----------------------------------

SLIGHTLY_OFF = "tests.reliability.bad_kernels:slightly_off"
SMALL = Case(Layout.from_lengths([2, 3], [12, 12], 4), Heads(2, 1, 16, 16), Options(q_dtype="float16", kv_dtype="float16"), seed=3)


def triage(*args: str) -> Result:
    return cli("triage", *args)


@pytest.mark.parametrize("mine", [["triage.md"], ["test_regression.py"], ["minimized/case.json", "triage.html"]],
                         ids=lambda m: " ".join(m))
def test_triage_never_replaces_a_users_file_under_out(tmp_path: Path, mine: list[str]) -> None:
    case = SMALL.save(tmp_path / "case.json")
    out = tmp_path / "out"
    for name in mine:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(f"my own {name}\n")
    result = triage(str(case), "-k", SLIGHTLY_OFF, "--out", str(out))
    assert_exit(result, 2, *[str(out / name) for name in mine], "not written by pa-oracle triage, or edited since")
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(mine), "a file was written"
    assert all((out / name).read_text() == f"my own {name}\n" for name in mine)


def test_triage_replaces_its_own_files_but_not_once_edited(tmp_path: Path) -> None:
    case = SMALL.save(tmp_path / "case.json")
    out = tmp_path / "out"
    assert_exit(triage(str(case), "-k", SLIGHTLY_OFF, "--out", str(out)), 1, f"report: {out / 'triage.md'}")
    assert_exit(triage(str(case), "-k", SLIGHTLY_OFF, "--out", str(out)), 1, f"report: {out / 'triage.md'}")
    edited = (out / "test_regression.py").read_text() + "# my fix of the test\n"
    (out / "test_regression.py").write_text(edited)
    assert_exit(triage(str(case), "-k", SLIGHTLY_OFF, "--out", str(out)), 2, str(out / "test_regression.py"))
    assert (out / "test_regression.py").read_text() == edited


def test_write_triage_never_replaces_a_users_file_under_out(write_finding: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "minimized").mkdir(parents=True)
    (out / "minimized" / "writes.json").write_text("my own case\n")
    result = triage(str(write_finding), "--kernel", WRITE_BUG, "--out", str(out))
    assert_exit(result, 2, str(out / "minimized" / "writes.json"), "not written by pa-oracle triage, or edited since")
    assert (out / "minimized" / "writes.json").read_text() == "my own case\n" and not (out / "triage.md").exists()
    (out / "minimized" / "writes.json").unlink()
    (out / "triage.md").write_text("my notes\n")
    assert_exit(triage(str(write_finding), "--kernel", WRITE_BUG, "--out", str(out)), 2, str(out / "triage.md"))
    assert (out / "triage.md").read_text() == "my notes\n" and not (out / "minimized" / "writes.json").exists()


ANALYSIS = "## Analysis\n\nThe kernel rounds the softmax denominator to half precision.\n"


@pytest.mark.parametrize("why", [False, True], ids=["an analysis", "an analysis and a why"])
def test_triage_upstream_keeps_a_users_analysis_in_issue_md(tmp_path: Path, why: bool) -> None:
    case = SMALL.save(tmp_path / "case.json")
    up = tmp_path / "up"
    args = [str(case), "-k", SLIGHTLY_OFF, "--no-minimize", "--upstream", str(up)]
    assert_exit(triage(*args, "--out", str(tmp_path / "t1")), 1)
    issue = (up / "ISSUE.md").read_text()
    issue = issue.replace("## The call", ANALYSIS + "\n## The call") + ("\n## Why\n\nA half-precision sum.\n" if why else "")
    (up / "ISSUE.md").write_text(issue)
    result = triage(*args, "--out", str(tmp_path / "t2"))
    assert_exit(result, 1)
    assert "not written" not in result.output
    again = (up / "ISSUE.md").read_text()
    assert ANALYSIS in again and again.count("## Analysis") == 1 and "## Minimal case" in again, again
    assert ("A half-precision sum." in again) == why
