"""Hostile ledgers, campaign states and ``golden add`` calls: each is refused with a message that
names the file and the entry or field (exit 2 on the command line), never accepted or a traceback."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.campaign.engine import save_finding
from pa_oracle.fuzz.campaign.ledger import GOLDEN, load_ledger
from pa_oracle.fuzz.campaign.state import BackendResult, CampaignState, CampaignStateError, FindingRecord
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import Case, CaseError, Heads, Layout, Options

from pa_oracle.cli import main

ENTRY = {"case": "c", "backends": ["b"], "versions": {"flashinfer": "1.0"}, "status": "tolerated", "reason": "r", "issue": "https://x.org/1"}

HOSTILE_ENTRIES = [
    ({"reason": "   "}, "entry 0: reason is blank"),
    ({"reason": ""}, "entry 0: reason is blank"),
    ({"reason": 5}, "entry 0: reason: expected str, got int 5"),
    ({"reason": None}, "entry 0: reason: expected str, got null"),
    ({"issue": "httpfoo"}, "entry 0: issue 'httpfoo' is not an http(s) URL"),
    ({"issue": "https://"}, "entry 0: issue 'https://' is not an http(s) URL"),
    ({"issue": "ftp://x.org/1"}, "entry 0: issue 'ftp://x.org/1' is not an http(s) URL"),
    ({"issue": "https://x.org/a b"}, "is not an http(s) URL"),
    ({"issue": 7}, "entry 0: issue: expected str, got int 7"),
    ({"status": "xfail"}, "entry 0 status must be 'tolerated' or 'quarantine'"),
    ({"status": True}, "entry 0: status: expected str, got bool"),
    ({"case": 3}, "entry 0: case: expected str, got int 3"),
    ({"case": " "}, "entry 0 must name its golden case"),
    ({"backends": "b"}, "entry 0: backends: expected list, got str"),
    ({"backends": [1]}, "entry 0: backends[0]: expected str, got int 1"),
    ({"backends": []}, "entry 0 'backends' must be a non-empty list"),
    ({"versions": {"flashinfer": 1.0}}, "entry 0: versions.flashinfer: expected str, got float 1.0"),
    ({"versions": ["1.0"]}, "entry 0: versions: expected object, got list"),
    ({"matches": []}, "entry 0: matches: expected object | null, got list"),
    ({"matches": {"group_size": [5, True]}}, "entry 0 'matches' group_size: True is not int"),
    ({"backend": ["b"]}, "entry 0: backend: unknown field (known: case, backends"),
]


def write_ledger(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "ledger.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize("change, says", HOSTILE_ENTRIES, ids=[s for _, s in HOSTILE_ENTRIES])
def test_a_malformed_ledger_entry_is_refused_naming_file_entry_and_field(tmp_path, change, says) -> None:
    path = write_ledger(tmp_path, {"schema_version": 1, "entries": [{**ENTRY, **change}]})
    with pytest.raises(CaseError) as caught:
        load_ledger(path)
    assert str(caught.value).startswith(f"{path}: ") and says in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    "data, says",
    [
        ("{nope", "not valid JSON"),
        ("", "not valid JSON"),
        ([], "unknown ledger schema_version None"),
        ({"schema_version": True, "entries": []}, "unknown ledger schema_version True"),
        ({"schema_version": 1, "entries": {}}, "a ledger holds exactly 'schema_version' and a list 'entries'"),
        ({"schema_version": 1, "entries": [], "extra": 1}, "a ledger holds exactly"),
        ({"schema_version": 1, "entries": [5]}, "entry 0 must be an object"),
        ('{"schema_version": 1, "entries": [], "entries": []}', "key 'entries' given twice"),
    ],
)
def test_a_malformed_ledger_file_is_refused_naming_the_file(tmp_path, data, says) -> None:
    path = write_ledger(tmp_path, data)
    with pytest.raises(CaseError) as caught:
        load_ledger(path)
    assert str(caught.value).startswith(f"{path}: ") and says in str(caught.value), str(caught.value)


def test_the_shipped_ledger_loads_and_a_valid_entry_keeps_its_fields(tmp_path) -> None:
    assert load_ledger()  # golden/ledger.json passes the stricter checks
    [entry] = load_ledger(write_ledger(tmp_path, {"schema_version": 1, "entries": [{**ENTRY, "matches": {"group_size": [5]}}]}))
    assert (entry.case, entry.backends, entry.versions, entry.status, entry.matches) == ("c", ("b",), {"flashinfer": "1.0"}, "tolerated", {"group_size": (5,)})


# --- campaign state ---------------------------------------------------------------------------------

CONFIG = {"seed": 3, "max_batch": 2, "max_kv_len": 12, "only": [], "backends": ["sdpa-math"], "kernels": [], "shard": "0/1"}
STATE = CampaignState(CONFIG, {"sdpa-math": BackendResult(
    "sdpa-math", examples=4, passed=3, chunks_done=1, status="finding", seen=["a", "b", "c", "d"],
    findings=[FindingRecord("abc", "fail", "out differs", "B=1", None, None)],
)})


def _good_state() -> dict:
    return json.loads(json.dumps({"schema_version": 1, "config": STATE.config, "backends": {n: r.to_json() for n, r in STATE.results.items()}}))


def backend(data: dict) -> dict:
    return data["backends"]["sdpa-math"]


HOSTILE_STATES = [
    (lambda d: d.update(schema_version=2), "unknown campaign schema_version 2"),
    (lambda d: d.update(schema_version="1"), "unknown campaign schema_version '1'"),
    (lambda d: d.pop("config"), "config: missing"),
    (lambda d: d.pop("backends"), "backends: missing"),
    (lambda d: d.update(extra=1), "extra: unknown field"),
    (lambda d: d.update(backends=[]), "backends: expected object, got list"),
    (lambda d: d.update(config=[]), "config: expected object, got list"),
    (lambda d: d["config"].update(seed="3"), "config.seed: expected int, got str"),
    (lambda d: d["config"].update(max_batch=0), "config.max_batch: expected int >= 1, got 0"),
    (lambda d: d["config"].update(max_kv_len=-1), "config.max_kv_len: expected int >= 0, got -1"),
    (lambda d: d["config"].update(only="alibi=false"), "config.only: expected list, got str"),
    (lambda d: d["config"].update(shard="2/2"), "config.shard: a shard is INDEX/COUNT"),
    (lambda d: d["config"].update(shard="1/2"), "config.shard: '1/2', but campaign.json holds shard 0/1's state"),
    (lambda d: backend(d).pop("backend"), "backends.sdpa-math.backend: missing"),
    (lambda d: backend(d).update(backend="flashinfer-decode"), "backends.sdpa-math.backend is 'flashinfer-decode'"),
    (lambda d: backend(d).update(examples=-3), "backends.sdpa-math.examples: expected int >= 0, got -3"),
    (lambda d: backend(d).update(passed=1.5), "backends.sdpa-math.passed: expected int, got float 1.5"),
    (lambda d: backend(d).update(chunks_done=True), "backends.sdpa-math.chunks_done: expected int, got bool"),
    (lambda d: backend(d).update(seconds=-1.0), "backends.sdpa-math.seconds: expected float >= 0.0, got -1.0"),
    (lambda d: backend(d).update(worst_ratio=float("nan")), "backends.sdpa-math.worst_ratio: expected float >= 0.0, got NaN"),
    (lambda d: backend(d).update(status="weird"), "backends.sdpa-math.status: invalid value 'weird' (one of"),
    (lambda d: backend(d).update(bogus=1), "backends.sdpa-math.bogus: unknown field (known: backend, examples"),
    (lambda d: backend(d).update(seen="ab"), "backends.sdpa-math.seen: expected list, got str"),
    (lambda d: backend(d).update(seen=[1]), "backends.sdpa-math.seen[0]: expected str, got int 1"),
    (lambda d: backend(d).update(coverage={"page_size": {"16": 2, "1": -1}}), "backends.sdpa-math.coverage.page_size.1: expected int >= 0, got -1"),
    (lambda d: backend(d).update(declared={"page_size": [16]}), "backends.sdpa-math.declared.page_size[0]: expected str, got int 16"),
    (lambda d: backend(d)["findings"].append({}), "backends.sdpa-math.findings[1].case_id: missing"),
    (lambda d: backend(d)["findings"][0].update(dir=3), "backends.sdpa-math.findings[0].dir: expected str | null, got int 3"),
    (lambda d: backend(d).update(findings={}), "backends.sdpa-math.findings: expected list, got object"),
    # counters that contradict each other (issue 31): no run writes them, a resume must not continue them
    (lambda d: backend(d).update(passed=5), "backends.sdpa-math.passed: 5 passed and 0 unsupported of 4 examples"),
    (lambda d: backend(d).update(unsupported=2), "backends.sdpa-math.passed: 3 passed and 2 unsupported of 4 examples"),
    (lambda d: backend(d).update(findings=[]), "backends.sdpa-math.status: 'finding' with no finding recorded"),
    (lambda d: backend(d).update(examples=10**18), "backends.sdpa-math.examples: expected int <= 9007199254740992, got 1000000000000000000"),
    (lambda d: backend(d).update(examples=1e18), "backends.sdpa-math.examples: expected int, got float 1e+18"),
    (lambda d: backend(d).update(examples=10**15), "backends.sdpa-math.examples: 1000000000000000 examples and 0 skipped as known, but only 4 case ids drawn"),
    (lambda d: backend(d).update(skipped_known=1), "backends.sdpa-math.examples: 4 examples and 1 skipped as known, but only 4 case ids drawn"),
    (lambda d: backend(d).update(exact=4), "backends.sdpa-math.exact: 4 bit-exact of 3 passed"),
    (lambda d: backend(d).update(no_keys=5), "backends.sdpa-math.no_keys: 5 cases without an attended key of 4 judged"),
    (lambda d: backend(d).update(skip_reasons={"x": 1}), "backends.sdpa-math.skip_reasons: 1 skips counted by reason, 0 unsupported"),
    (lambda d: backend(d).update(seconds=float("inf")), "backends.sdpa-math.seconds: expected float <= 1e+300, got Infinity"),
]


@pytest.mark.parametrize("edit, says", HOSTILE_STATES, ids=[s for _, s in HOSTILE_STATES])
def test_a_malformed_campaign_state_is_refused_naming_file_and_field(tmp_path, edit, says) -> None:
    data = _good_state()
    edit(data)
    path = tmp_path / "campaign.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CampaignStateError) as caught:
        CampaignState.load(path)
    assert str(caught.value).startswith(f"{path}: ") and says in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "not valid JSON"),
        ("{nope", "not valid JSON"),
        (json.dumps(_good_state(), indent=1)[:200], "not valid JSON"),  # a truncated file
        ("[]", "a campaign state is a JSON object, got list"),
        ("null", "a campaign state is a JSON object, got NoneType"),
        ('{"schema_version": 1, "schema_version": 1}', "key 'schema_version' given twice"),
    ],
    ids=["empty", "not JSON", "truncated", "a list", "null", "duplicate key"],
)
def test_a_state_file_that_is_no_state_object_is_refused_naming_the_file(tmp_path, text, says) -> None:
    path = tmp_path / "campaign.json"
    path.write_text(text)
    with pytest.raises(CampaignStateError, match=f"^{path}: ") as caught:
        CampaignState.load(path)
    assert says in str(caught.value)


def test_a_valid_state_loads_as_saved_and_a_newer_config_key_is_kept(tmp_path) -> None:
    STATE.save(tmp_path / "campaign.json")
    assert CampaignState.load(tmp_path / "campaign.json") == STATE
    data = _good_state()
    data["config"]["a_newer_option"] = 1
    (tmp_path / "campaign.json").write_text(json.dumps(data))
    assert CampaignState.load(tmp_path / "campaign.json").config["a_newer_option"] == 1


@pytest.mark.parametrize("edit, says", [
    (lambda r: r.update(passed=9), "backends.sdpa-math.passed: 9 passed and 0 unsupported of 4 examples"),
    (lambda r: r.update(findings=[]), "backends.sdpa-math.status: 'finding' with no finding recorded"),
    (lambda r: r.update(examples=10**18), "backends.sdpa-math.examples: expected int <= 9007199254740992"),
], ids=["passed > examples", "finding without one", "1e18 examples"])
def test_resume_of_contradictory_counters_exits_2_naming_file_and_field(tmp_path, edit, says) -> None:
    data = _good_state()
    edit(backend(data))
    (tmp_path / "campaign.json").write_text(json.dumps(data))
    before = (tmp_path / "campaign.json").read_text()
    result = CliRunner().invoke(main, ["fuzz", "--out", str(tmp_path), "--resume"])
    assert result.exit_code == 2 and f"{tmp_path / 'campaign.json'}: malformed campaign state: {says}" in result.output, result.output
    assert "Traceback" not in result.output and (tmp_path / "campaign.json").read_text() == before, "the state is kept as it was"


def test_resume_from_a_malformed_state_exits_2_naming_file_and_field(tmp_path) -> None:
    data = _good_state()
    backend(data).update(examples=-3)
    (tmp_path / "campaign.json").write_text(json.dumps(data))
    result = CliRunner().invoke(main, ["fuzz", "--out", str(tmp_path), "--resume"])
    assert result.exit_code == 2 and "campaign.json: malformed campaign state: backends.sdpa-math.examples" in result.output, result.output
    assert "Traceback" not in result.output


# --- golden add ---------------------------------------------------------------------------------------

PLANTED = "pa_oracle.fuzz.quality.planted:{}"
ISSUE = "https://github.com/example/kernels/issues/7"
MIXED = Case(
    Layout.from_lengths([2, 1, 3], [9, 8, 13], page_size=4, page_order=[3, 0, 7, 5, 11, 1, 8, 2, 10, 6, 4, 9], extra_pages=3),
    Heads(4, 2, 16, 16), Options(q_dtype="bfloat16", kv_dtype="bfloat16"), seed=1,
)


def finding(tmp_path: Path, kernel: str) -> Path:
    backend = UserKernel.from_spec(PLANTED.format(kernel))
    return save_finding(check_case(backend, MIXED), backend, tmp_path / "findings", PLANTED.format(kernel))


@pytest.fixture
def golden(tmp_path) -> Path:
    shutil.copy(GOLDEN / "ledger.json", tmp_path / "ledger.json")
    (tmp_path / "cases").mkdir()
    return tmp_path


def add(finding_dir: Path, golden_dir: Path, *extra: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, ["golden", "add", str(finding_dir), "--golden-dir", str(golden_dir), "--reason", "r", "--issue", ISSUE, *extra])


@pytest.mark.parametrize(
    "kernel, extra, says",
    [
        ("correct_attention", (), "passes on every backend it was run on (pa_oracle.fuzz.quality.planted:correct_attention): it is not a finding"),
        ("last_page_off_by_one", ("-b", PLANTED.format("last_page_off_by_one"), "-b", PLANTED.format("correct_attention")),
         "passes on pa_oracle.fuzz.quality.planted:correct_attention (fails on pa_oracle.fuzz.quality.planted:last_page_off_by_one)"),
        ("last_page_off_by_one", ("-b", "flashinfer-decoed"), "--backend 'flashinfer-decoed' is no known backend; did you mean flashinfer-decode"),
        ("last_page_off_by_one", ("-b", "no_such_module:fn"), "--backend 'no_such_module:fn': no such kernel"),
        ("last_page_off_by_one", ("-b", "pa_oracle.fuzz.quality.planted:no_such_fn"), "no such kernel"),
    ],
    ids=["passes everywhere", "passes on one of its backends", "unknown name", "unknown module", "unknown function"],
)
def test_golden_add_refuses_what_is_no_finding_and_unknown_backends(tmp_path, golden, kernel, extra, says) -> None:
    ledger = (golden / "ledger.json").read_text()
    result = add(finding(tmp_path, kernel), golden, *extra)
    assert result.exit_code == 2 and says in result.output, result.output
    assert (golden / "ledger.json").read_text() == ledger and not list((golden / "cases").iterdir())


def test_golden_add_refuses_to_append_to_a_ledger_that_does_not_load(tmp_path, golden) -> None:
    (golden / "ledger.json").write_text(json.dumps({"schema_version": 1, "entries": [{**ENTRY, "reason": "  "}]}))
    result = add(finding(tmp_path, "last_page_off_by_one"), golden)
    assert result.exit_code == 2 and "the ledger does not load" in result.output and "reason is blank" in result.output, result.output


def test_golden_add_records_where_the_case_failed(tmp_path, golden) -> None:
    result = add(finding(tmp_path, "last_page_off_by_one"), golden, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["verdicts"] == {PLANTED.format("last_page_off_by_one"): "fail"}
    entry = load_ledger(golden / "ledger.json")[-1]
    assert entry.backends == (PLANTED.format("last_page_off_by_one"),) and entry.reason == "r"


def test_results_from_json_checks_a_single_result() -> None:
    good = copy.deepcopy(_good_state()["backends"]["sdpa-math"])
    assert BackendResult.from_json(good) == STATE.results["sdpa-math"]
    with pytest.raises(CampaignStateError, match="backend result: examples: expected int >= 0, got -1"):
        BackendResult.from_json({**good, "examples": -1})
