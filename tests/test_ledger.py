from __future__ import annotations

import json

import pytest
from pa_oracle.fuzz.campaign.ledger import load_ledger, lookup
from pa_oracle.oracle.case import CaseError
from pa_oracle.oracle.tensors import load_case
from pa_oracle.fuzz.campaign.ledger import GOLDEN

GOLDEN_CASES = GOLDEN / "cases"


def write(tmp_path, entries, version=1):
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps({"schema_version": version, "entries": entries}))
    return path


ENTRY = {"case": "c", "backends": ["b"], "versions": {"flashinfer": "1.0"}, "status": "tolerated", "reason": "r", "issue": "https://x/1"}


def test_entries_match_case_backend_and_version(tmp_path) -> None:
    entries = load_ledger(write(tmp_path, [ENTRY]))
    assert lookup(entries, "c", "b", {"flashinfer": "1.0", "torch": "2"}) is not None
    assert lookup(entries, "c", "b", {"flashinfer": "1.1"}) is None  # a new version must pass again
    assert lookup(entries, "c", "other", {"flashinfer": "1.0"}) is None


@pytest.mark.parametrize(
    "change, message",
    [({"status": "xfail"}, "status must be"), ({"issue": ""}, "must cite a reason and an issue URL"), ({"reason": ""}, "must cite")],
)
def test_malformed_entries_are_refused(tmp_path, change, message) -> None:
    with pytest.raises(CaseError, match=message):
        load_ledger(write(tmp_path, [{**ENTRY, **change}]))


def test_unknown_ledger_version_is_refused(tmp_path) -> None:
    with pytest.raises(CaseError, match=r"unknown ledger schema_version 3 \(this version reads 1, 2\)"):
        load_ledger(write(tmp_path, [ENTRY], version=3))


def test_known_finding_matches_the_predicate_backend_and_version(tmp_path) -> None:
    from pa_oracle.fuzz.campaign.ledger import known_finding
    from pa_oracle.oracle.case import Case, Heads, Layout, Options

    entries = load_ledger(write(tmp_path, [{**ENTRY, "matches": {"alibi": True, "logits_soft_cap": True, "group_size": [1, 5]}}]))
    both = Options(alibi_slopes=(0.5,), logits_soft_cap=30.0)
    case = Case(Layout.from_lengths([1], [3], 16), Heads(1, 1, 8, 8), both)
    assert known_finding(entries, case, "b", {"flashinfer": "1.0"}) is entries[0]
    assert known_finding(entries, case, "b", {"flashinfer": "1.1"}) is None
    assert known_finding(entries, case, "other", {"flashinfer": "1.0"}) is None
    alibi_only = case.replace(options=Options(alibi_slopes=(0.5,)))
    assert known_finding(entries, alibi_only, "b", {"flashinfer": "1.0"}) is None
    group_2 = Case(Layout.from_lengths([1], [3], 16), Heads(2, 1, 8, 8), Options(alibi_slopes=(0.5, 0.25), logits_soft_cap=30.0))
    assert known_finding(entries, group_2, "b", {"flashinfer": "1.0"}) is None


def test_a_golden_case_inside_another_entrys_class_replays_as_that_known_finding(tmp_path) -> None:
    """A regression case that fails on a backend only through a class another entry's ``matches`` names
    (what a campaign skips as known) is that known finding in a corpus replay, not a new one; a case named
    by an entry of its own keeps its own verdict, and one outside every class is still a finding."""
    from pa_oracle.fuzz.campaign.ledger import ledger_verdict
    from pa_oracle.oracle.case import Case, Heads, Layout, Options

    entries = load_ledger(write(tmp_path, [{**ENTRY, "matches": {"alibi": True}}, {**ENTRY, "case": "named", "backends": ["x"]}]))
    inside = Case(Layout.from_lengths([1], [3], 16), Heads(1, 1, 8, 8), Options(alibi_slopes=(0.5,)))
    outside = inside.replace(options=Options())
    versions = {"flashinfer": "1.0"}
    known = ledger_verdict(entries, "regress-x", "b", versions, "fail", case=inside)
    assert known.kind == "known" and known.entry is entries[0]
    assert ledger_verdict(entries, "regress-x", "b", versions, "fail", case=outside).kind == "finding"
    assert ledger_verdict(entries, "regress-x", "b", versions, "pass", case=inside).kind == "pass"
    assert ledger_verdict(entries, "regress-x", "b", versions, "fail").kind == "finding"  # no case given: by name only
    assert ledger_verdict(entries, "named", "x", {"flashinfer": "1.1"}, "fail", case=inside).kind == "finding"  # its own
    assert ledger_verdict(entries, "regress-x", "b", versions, "crash", case=inside).kind == "finding"  # not a wrong number


def test_a_golden_case_inside_a_quarantined_class_is_not_launched_whatever_entry_comes_first(tmp_path) -> None:
    from pa_oracle.fuzz.campaign.ledger import ledger_verdict, quarantined_class
    from pa_oracle.oracle.case import Case, Heads, Layout, Options

    tolerated = {**ENTRY, "matches": {"alibi": True}}
    quarantined = {**ENTRY, "case": "q", "status": "quarantine", "matches": {"head_dim": [8]}}
    entries = load_ledger(write(tmp_path, [tolerated, quarantined]))
    case = Case(Layout.from_lengths([1], [3], 16), Heads(1, 1, 8, 8), Options(alibi_slopes=(0.5,)))
    versions = {"flashinfer": "1.0"}
    assert quarantined_class(entries, "regress-x", case, "b", versions) is entries[1]
    assert ledger_verdict(entries, "regress-x", "b", versions, None, case=case).kind == "quarantine"
    assert quarantined_class(entries, "c", case, "b", versions) is None  # its own entry speaks for it


def test_an_entry_without_a_predicate_matches_no_drawn_case(tmp_path) -> None:
    from pa_oracle.fuzz.campaign.ledger import known_finding
    from pa_oracle.oracle.case import Case, Heads, Layout

    entries = load_ledger(write(tmp_path, [ENTRY]))
    assert known_finding(entries, Case(Layout.from_lengths([1], [0], 16), Heads(1, 1, 8, 8)), "b", {"flashinfer": "1.0"}) is None


@pytest.mark.parametrize(
    "matches, message",
    [
        ({"group_sise": [5]}, "unknown feature 'group_sise'; did you mean group_size"),
        ({"alibi": "yes"}, "alibi: 'yes' is not bool"),
        ({"group_size": [5, True]}, "group_size: True is not int"),
        ({"kv_dtype": "fp8"}, "kv_dtype: 'fp8' is not one of"),
        ({"group_size": []}, "empty list matches nothing"),
        ({}, "non-empty object"),
    ],
)
def test_malformed_predicates_are_refused(tmp_path, matches, message) -> None:
    with pytest.raises(CaseError, match=message):
        load_ledger(write(tmp_path, [{**ENTRY, "matches": matches}]))


@pytest.mark.parametrize(
    "change, message",
    [({"backend": ["b"]}, r"entry 0: backend: unknown field \(known: case, backends"), ({"backends": []}, "non-empty list"), ({"versions": {"x": 1}}, "version strings")],
)
def test_malformed_entry_fields_are_refused(tmp_path, change, message) -> None:
    with pytest.raises(CaseError, match=message):
        load_ledger(write(tmp_path, [{**ENTRY, **change}]))


def test_every_predicate_in_the_ledger_matches_its_own_golden_case() -> None:
    from pa_oracle.fuzz.campaign.ledger import GOLDEN

    with_predicate = [e for e in load_ledger() if e.matches]
    assert with_predicate
    wrong = [e.case for e in with_predicate if not e.matches_case(load_case(GOLDEN / "cases" / f"{e.case}.json"))]
    assert not wrong, f"these ledger predicates do not match their own golden case: {wrong}"


def test_a_version_range_applies_inside_it_only(tmp_path) -> None:
    entries = load_ledger(write(tmp_path, [{**ENTRY, "versions": {"flashinfer": ">=0.6.18.post1,<0.7.2.post1"}}]))
    assert lookup(entries, "c", "b", {"flashinfer": "0.6.18.post1"}) is not None
    assert lookup(entries, "c", "b", {"flashinfer": "0.7.0"}) is not None
    assert lookup(entries, "c", "b", {"flashinfer": "0.7.2.post1"}) is None
    assert lookup(entries, "c", "b", {"torch": "2"}) is None  # the library is not installed


def test_a_bad_version_specifier_is_refused(tmp_path) -> None:
    with pytest.raises(CaseError, match=r"versions\['flashinfer'\]: '>>1' is no version or PEP 440 specifier"):
        load_ledger(write(tmp_path, [{**ENTRY, "versions": {"flashinfer": ">>1"}}]))


def test_entries_match_the_kernel_family(tmp_path) -> None:
    entries = load_ledger(write(tmp_path, [{**{k: v for k, v in ENTRY.items() if k != "backends"}, "families": ["fam"]}]))
    assert lookup(entries, "c", "b-hnd", {"flashinfer": "1.0"}, family="fam") is not None
    assert lookup(entries, "c", "b-hnd", {"flashinfer": "1.0"}, family="other") is None
    assert lookup(entries, "c", "fam", {"flashinfer": "1.0"}) is not None  # a backend without a family is its own


@pytest.mark.parametrize(
    ("versions", "status", "kind", "words"),
    [
        ({"flashinfer": "1.0"}, "fail", "known", "known finding"),
        ({"flashinfer": "1.0"}, "pass", "unexpected-pass", "remove the entry"),
        ({"flashinfer": "1.1"}, "pass", "fixed", "FIXED in flashinfer 1.1"),
        ({"flashinfer": "1.1"}, "fail", "finding", "outside its ledger entry's versions"),
        ({"flashinfer": "1.1"}, "unsupported", "no-verdict", "no verdict"),
        ({"flashinfer": "1.0"}, "error", "error", "could not judge"),
    ],
)
def test_the_ledger_verdict_says_known_fixed_or_new(tmp_path, versions, status, kind, words) -> None:
    from pa_oracle.fuzz.campaign.ledger import ledger_verdict

    entries = load_ledger(write(tmp_path, [ENTRY]))
    verdict = ledger_verdict(entries, "c", "b", versions, status)
    assert verdict.kind == kind and words in verdict.message
    assert verdict.ok is (kind not in ("finding", "unexpected-pass", "error"))
    assert ledger_verdict(entries, "other", "b", versions, status).kind in ("pass", "finding", "no-verdict", "error")


def test_an_unreported_entry_names_its_report(tmp_path) -> None:
    from pa_oracle.fuzz.campaign.ledger import missing_reports

    unreported = {k: v for k, v in ENTRY.items() if k != "issue"} | {"reported": False, "report": "reports/x/ISSUE.md"}
    entries = load_ledger(write(tmp_path, [unreported]))
    assert entries[0].issue is None and missing_reports(entries, tmp_path / "ledger.json") == ["reports/x/ISSUE.md"]
    (tmp_path / "reports" / "x").mkdir(parents=True)
    (tmp_path / "reports" / "x" / "ISSUE.md").write_text("# x\n")
    assert missing_reports(entries, tmp_path / "ledger.json") == []
    for change, message in [({"report": None}, "needs 'report'"), ({"issue": "https://x/1"}, "give one of the two"),
                            ({"report": "/abs/ISSUE.md"}, "relative to the ledger")]:
        with pytest.raises(CaseError, match=message):
            load_ledger(write(tmp_path, [{**unreported, **change}]))
    with pytest.raises(CaseError, match="goes with 'reported': false"):
        load_ledger(write(tmp_path, [{**ENTRY, "report": "reports/x/ISSUE.md"}]))


def test_every_entry_of_the_golden_ledger_links_an_upstream_issue_or_a_committed_report() -> None:
    from pa_oracle.fuzz.campaign.ledger import GITHUB_ISSUE, GOLDEN, missing_reports

    entries = load_ledger()
    not_links = [(e.case, e.issue) for e in entries if e.issue is not None and not GITHUB_ISSUE.match(e.issue)]
    assert not not_links, f"an issue must be https://github.com/ORG/REPO/issues/N or /pull/N: {not_links}"
    assert all(e.issue is not None or e.report is not None for e in entries)
    assert not missing_reports(entries, GOLDEN / "ledger.json"), "commit the ready-to-file reports under golden/reports/"


def test_the_group_size_predicates_follow_each_version_s_dispatch() -> None:
    from pa_oracle.fuzz.draw.strategies import GROUP_SIZES

    dispatched = {"0.6.18.post1": {1, 2, 3, 4, 6, 8}, "0.7.2.post1": {1, 2, 3, 4, 6, 8, 16}}  # DISPATCH_GQA_GROUP_SIZE
    for version, groups in dispatched.items():
        entry = lookup(load_ledger(), "flashinfer-decode-group-size-5", "flashinfer-decode", {"flashinfer": version},
                       family="flashinfer-decode-cuda-core")
        assert entry is not None and set(entry.matches["group_size"]) == set(GROUP_SIZES) - groups, version


def test_the_empty_row_class_matches_every_flashinfer_kernel_that_has_it() -> None:
    from pa_oracle.backends import discover
    from pa_oracle.fuzz.campaign.ledger import known_finding

    case = load_case(GOLDEN_CASES / "flashinfer-decode-empty-request-lse.json")
    for name in ("flashinfer-decode-hnd", "flashinfer-prefill-fa2-hnd", "flashinfer-ragged-fa2", "flashinfer-decode-tc"):
        backend = discover()[name]()
        assert known_finding(load_ledger(), case, name, {"flashinfer": "0.6.18.post1"}, family=backend.kernel_family), name
        assert not known_finding(load_ledger(), case, name, {"flashinfer": "0.7.2.post1"}, family=backend.kernel_family), name


def test_conventions_and_preconditions_are_no_longer_findings() -> None:
    cases = {e.case for e in load_ledger()}
    assert not {"flash-attn-kvcache-alibi-lse", "flash-attn-kvcache-paged-alibi-lse"} & cases  # converted by the adapter
    sglang = [e for e in load_ledger() if e.case == "sglang-decode-empty-request"]
    assert sglang and all("sglang-triton-decode" not in e.families and not e.backends for e in sglang)  # SGLang's precondition


CHECKED = {**ENTRY, "check": "mask-replan", "matches": {"custom_mask": "none"}}


def test_an_entry_of_a_check_applies_to_that_check_s_replay_and_campaigns_only(tmp_path) -> None:
    from pa_oracle.fuzz.campaign.ledger import known_finding, ledger_verdict
    from pa_oracle.oracle.case import Case, Heads, Layout

    checked, oracle = load_ledger(write(tmp_path, [CHECKED, {**ENTRY, "case": "o", "matches": {"custom_mask": "none"}}], version=2))
    assert lookup([checked], "c", "b", {"flashinfer": "1.0"}, check="mask-replan") is checked
    assert lookup([checked], "c", "b", {"flashinfer": "1.0"}) is None  # the oracle's replay of the case: no entry
    assert ledger_verdict([checked], "c", "b", {"flashinfer": "1.0"}, "fail", check="mask-replan").kind == "known"
    assert ledger_verdict([checked], "c", "b", {"flashinfer": "1.0"}, "fail").kind == "finding"
    assert ledger_verdict([checked], "c", "b", {"flashinfer": "1.1"}, "pass", check="mask-replan").kind == "fixed"
    case = Case(Layout.from_lengths([2], [3], 16), Heads(1, 1, 8, 8))
    assert known_finding([checked], case, "b", {"flashinfer": "1.0"}, check="mask-replan") is checked
    assert known_finding([checked], case, "b", {"flashinfer": "1.0"}) is None  # an oracle campaign still judges it
    assert known_finding([checked], case, "b", {"flashinfer": "1.0"}, check="plan-reuse") is None
    assert known_finding([oracle], case, "b", {"flashinfer": "1.0"}, check="mask-replan") is oracle  # judged by the oracle too
    assert known_finding([oracle], case, "b", {"flashinfer": "1.0"}, check="relabel") is None  # a relation between two outputs


@pytest.mark.parametrize(
    "entry, version, message",
    [
        ({**CHECKED, "check": "mask-replann"}, 2, r"entry 0 check: 'mask-replann' is no check; did you mean mask-replan"),
        ({**CHECKED, "check": 3}, 2, r"entry 0: check: expected str, got int 3 \('check' names the check"),
        (CHECKED, 1, r"entry 0: check: a ledger entry names its check from schema_version 2 on \(this file says 1\)"),
    ],
    ids=["unknown", "not-a-string", "version-1"],
)
def test_a_bad_check_is_refused_naming_the_file_entry_and_field(tmp_path, entry, version, message) -> None:
    path = write(tmp_path, [entry], version=version)
    with pytest.raises(CaseError, match=f"^{path}: {message}"):
        load_ledger(path)


def test_a_golden_case_s_check_is_its_meta_check_and_a_bad_one_names_file_and_field(tmp_path) -> None:
    from pa_oracle.fuzz.campaign.ledger import golden_check
    from pa_oracle.oracle.case import Case, Heads, Layout

    case = Case(Layout.from_lengths([1], [3], 16), Heads(1, 1, 8, 8))
    assert golden_check(case, "x.json") == "oracle"
    assert golden_check(case.replace(meta={"check": "mask-replan"}), "x.json") == "mask-replan"
    with pytest.raises(CaseError, match=r"^x.json: meta.check: 'zzz' is no check \(known: oracle, "):
        golden_check(case.replace(meta={"check": "zzz"}), "x.json")


def test_the_stale_mask_entry_follows_the_source_and_skips_only_in_mask_replan_campaigns() -> None:
    from pa_oracle.backends import discover
    from pa_oracle.fuzz.campaign.ledger import golden_check, known_finding

    path = GOLDEN_CASES / "flashinfer-ragged-stale-custom-mask.json"
    case = load_case(path)
    (entry,) = [e for e in load_ledger() if e.case == path.stem]
    assert golden_check(case, path) == entry.check == "mask-replan" and case.custom_mask is None and case.tensors_file is None
    assert entry.families == ("flashinfer-ragged-fa2",) and entry.issue.endswith("/pull/2690")
    assert "else" in entry.reason and "_custom_mask_buf" in entry.reason  # quotes the source
    for version in ("0.6.18.post1", "0.7.2.post1"):  # both wheels' ragged plan lack the else
        assert lookup(load_ledger(), path.stem, "flashinfer-ragged-mask", {"flashinfer": version}, "flashinfer-ragged-fa2", "mask-replan")
    assert not lookup(load_ledger(), path.stem, "flashinfer-ragged-mask", {"flashinfer": "0.6.17"}, "flashinfer-ragged-fa2", "mask-replan")
    backends = discover()
    for name in ("flashinfer-prefill-mask-replan", "flashinfer-prefill-mask"):  # the paged wrapper clears its mask: not listed
        assert not lookup(load_ledger(), path.stem, name, {"flashinfer": "0.6.18.post1"}, backends[name]().kernel_family, "mask-replan")
    ragged = backends["flashinfer-ragged-mask"]()
    args = (case, ragged.name, {"flashinfer": "0.6.18.post1"}, ragged.kernel_family)
    assert known_finding(load_ledger(), *args, check="mask-replan") is not None
    assert known_finding(load_ledger(), *args) is None  # the oracle campaign of the ragged adapter still draws unmasked cases


def test_a_campaign_of_the_check_skips_its_known_finding_and_the_oracle_campaign_does_not(tmp_path) -> None:
    from pa_oracle.backends.user import UserKernel
    from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
    from pa_oracle.fuzz.checks.registry import CHECKS
    from pa_oracle.fuzz.draw.strategies import Limits
    from pa_oracle.fuzz.quality import planted_families

    stale = UserKernel(planted_families.stale_mask_on_replan)
    entries = load_ledger(write(tmp_path, [{**CHECKED, "backends": [stale.name], "versions": {}}], version=2))
    small = Limits(max_batch=2, max_kv_len=12, max_qo_len=4, max_kv_heads=2, max_qo_heads=4, head_dims=(8,))
    planted_families._last_mask.clear()
    found = fuzz_backend(stale, CampaignConfig(isolate=False, examples=10, limits=small), check=CHECKS["mask-replan"])
    assert found.status == "finding" and found.finding.check == "mask-replan", found.line()  # (shrinking reuses shapes: any step)
    planted_families._last_mask.clear()
    skipped = fuzz_backend(stale, CampaignConfig(isolate=False, examples=10, limits=small, ledger=entries), check=CHECKS["mask-replan"])
    assert not skipped.findings and skipped.skipped_known > 0 and skipped.examples == 0, skipped.line()  # every drawn case is unmasked
    planted_families._last_mask.clear()
    oracle = fuzz_backend(stale, CampaignConfig(isolate=False, examples=10, limits=small, ledger=entries))
    assert oracle.skipped_known == 0 and oracle.examples == 10, oracle.line()


def test_pa_oracle_metamorphic_skips_a_known_check_finding_and_no_skip_known_finds_it(tmp_path) -> None:
    from click.testing import CliRunner
    from pa_oracle.fuzz.quality import planted_families

    from pa_oracle.cli import main

    spec = "pa_oracle.fuzz.quality.planted_families:stale_mask_on_replan"
    ledger = write(tmp_path, [{**CHECKED, "backends": [spec], "versions": {}}], version=2)
    args = ["metamorphic", "-k", spec, "-c", "mask-replan", "-n", "6", "--no-isolate", "--ledger", str(ledger), "--json"]
    planted_families._last_mask.clear()
    skipped = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a")])
    (result,) = json.loads(skipped.stdout)
    assert result["violation"] is None and result["examples"] == 0 and result["skipped_known"] > 0, skipped.output
    assert skipped.exit_code == 3 and "skipped as known" in skipped.stderr  # judged nothing: never "ok"
    planted_families._last_mask.clear()
    found = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b"), "--no-skip-known"])
    assert found.exit_code == 1 and json.loads(found.stdout)[0]["violation"]["status"] == "fail", found.output
