from __future__ import annotations

import warnings

import pytest
from pa_oracle.backends import discover
from pa_oracle.fuzz.campaign.ledger import GOLDEN, check_mismatches, golden_cases, golden_check, ledger_verdict, load_ledger, lookup
from pa_oracle.fuzz.checks.registry import ALL_CHECKS
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.tensors import load_case

LEDGER = load_ledger()


class FixedUpstream(UserWarning):
    """A golden case that its ledger entry's versions cover no longer fails here: fixed upstream."""


@pytest.mark.parametrize("backend_name", sorted(discover()))
@pytest.mark.parametrize("case_path", golden_cases(), ids=lambda p: p.stem)
def test_golden_case(case_path, backend_name: str) -> None:
    backend = discover()[backend_name]()
    reason = backend.unavailable_reason()
    if reason:
        pytest.skip(f"{backend_name}: {reason}")
    case = load_case(case_path)
    check_name = golden_check(case, case_path)  # the oracle, or the check whose finding the case is
    check = ALL_CHECKS[check_name]
    versions, family = backend.versions(), backend.kernel_family
    entry = lookup(LEDGER, case_path.stem, backend_name, versions, family, check_name)
    if entry and entry.status == "quarantine":
        pytest.skip(f"quarantined: {entry.reason} ({entry.tracked_at})")
    applies = check.capabilities(backend)
    if isinstance(applies, str):
        pytest.skip(f"{check_name}: {applies}")
    outcome = check.judge(case, backend)
    if outcome.status == "unsupported":
        pytest.skip(outcome.message)
    verdict = ledger_verdict(LEDGER, case_path.stem, backend_name, versions, outcome.status, family, check_name, case)
    if verdict.kind == "fixed":  # loud, not a silent pass: FINDINGS.md's table says fixed in which version
        warnings.warn(FixedUpstream(f"{backend_name} on {case_path.stem}: {verdict.message}"), stacklevel=1)
    assert verdict.ok, f"{backend_name} on {case_path.stem} ({check_name}): {verdict.message}: {outcome.message}"


def test_every_ledger_entry_names_a_golden_case_judged_by_its_check() -> None:
    checks = {p.stem: golden_check(load_case(p), p) for p in golden_cases()}
    assert LEDGER and all(entry.case in checks for entry in LEDGER)
    assert not check_mismatches(LEDGER, checks)


def test_converted_conventions_stay_golden_cases_that_must_pass() -> None:
    names = {p.stem for p in golden_cases()}
    converted = {"flash-attn-kvcache-alibi-lse", "flash-attn-kvcache-paged-alibi-lse"}
    assert converted <= names and not converted & {e.case for e in LEDGER}


STALE_MASK = GOLDEN / "cases" / "flashinfer-ragged-stale-custom-mask.json"
PLANTED = "pa_oracle.fuzz.quality.planted_families:{}"


def _in_process(backend, check):
    import contextlib

    return contextlib.nullcontext(lambda case: check.judge(case, backend))


def test_the_stale_mask_golden_case_fails_through_its_check_on_a_stateful_kernel_only(tmp_path) -> None:
    import json

    from pa_oracle.backends.user import UserKernel
    from pa_oracle.fuzz.campaign.replay import replay_corpus
    from pa_oracle.fuzz.quality import planted_families

    planted_families._last_mask.clear()
    stale, correct = (UserKernel.from_spec(PLANTED.format(n)) for n in ("stale_mask_on_replan", "correct_replanned_mask"))
    alone = check_case(stale, load_case(STALE_MASK))  # the oracle alone, in a fresh state, sees nothing wrong
    assert alone.status == "pass", alone.message
    stale_record, correct_record = replay_corpus([STALE_MASK], [stale, correct], LEDGER, _in_process)
    assert stale_record.check == "mask-replan" and stale_record.status == "fail", stale_record.message
    assert stale_record.message.startswith("stale mask:") and stale_record.ledger == "finding"  # the ledger names FlashInfer's, not it
    assert (correct_record.status, correct_record.ledger) == ("pass", "pass"), correct_record.message
    entry = {**next(e for e in json.loads((GOLDEN / "ledger.json").read_text())["entries"] if e["case"] == STALE_MASK.stem),
             "families": [], "backends": [stale.name], "versions": {}}
    (tmp_path / "ledger.json").write_text(json.dumps({"schema_version": 2, "entries": [entry]}))
    named = load_ledger(tmp_path / "ledger.json")
    planted_families._last_mask.clear()
    stale_record, correct_record = replay_corpus([STALE_MASK], [stale, correct], named, _in_process)
    assert (stale_record.ledger, correct_record.ledger) == ("known", "pass"), (stale_record, correct_record)


def test_pa_oracle_replay_judges_a_golden_case_through_its_check(tmp_path) -> None:
    from click.testing import CliRunner
    from pa_oracle.fuzz.quality import planted_families

    from pa_oracle.cli import main

    planted_families._last_mask.clear()
    stale = CliRunner().invoke(main, ["replay", str(STALE_MASK), "-k", PLANTED.format("stale_mask_on_replan")])
    assert stale.exit_code == 1 and "FAIL: stale mask:" in stale.output, stale.output
    correct = CliRunner().invoke(main, ["replay", str(STALE_MASK), "-k", PLANTED.format("correct_replanned_mask")])
    assert correct.exit_code == 0 and "PASS: case, other mask, case again" in correct.output, correct.output
    corpus = CliRunner().invoke(main, ["replay", str(STALE_MASK), "-b", "sdpa-math", "-k", PLANTED.format("stale_mask_on_replan")])
    assert corpus.exit_code == 1, corpus.output  # a new finding on the planted kernel; sdpa-math takes no mask
    assert "flashinfer-ragged-stale-custom-mask on sdpa-math (mask-replan): unsupported - mask-replan: the kernel takes no custom mask" in corpus.output
    assert "on pa_oracle.fuzz.quality.planted_families:stale_mask_on_replan (mask-replan): fail" in corpus.output


@pytest.mark.parametrize("version, clears, status, kind", [
    ("0.6.18.post1", False, "fail", "known"), ("0.6.18.post1", True, "pass", "unexpected-pass"), ("0.6.17", True, "pass", "fixed"),
], ids=["keeps-mask", "fixed-inside-the-range", "before-the-range"])
def test_the_ragged_adapter_replays_the_golden_case_against_a_wrapper_written_from_the_source(
    version: str, clears: bool, status: str, kind: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from pa_oracle.backends import get_backend
    from pa_oracle.fuzz.campaign.replay import replay_corpus

    from tests.fake_kernels import _module
    from tests.test_mask_replan import _FakeFixedWrapper, _FakeRaggedWrapper

    wrapper = _FakeFixedWrapper if clears else _FakeRaggedWrapper
    monkeypatch.setitem(sys.modules, "flashinfer", _module("flashinfer", BatchPrefillWithRaggedKVCacheWrapper=wrapper, __version__=version))
    backend = get_backend("flashinfer-ragged-mask")
    monkeypatch.setattr(type(backend), "device", property(lambda self: "cpu"))
    (record,) = replay_corpus([STALE_MASK], [backend], LEDGER, _in_process)
    assert (record.status, record.ledger) == (status, kind), record


def test_golden_add_keeps_a_check_finding_s_check_in_the_case_and_the_entry(tmp_path) -> None:
    import shutil

    from pa_oracle.backends.user import UserKernel
    from pa_oracle.fuzz.campaign.findings import save_finding
    from pa_oracle.fuzz.quality import planted_families
    from pa_oracle.fuzz.triage.golden import GoldenError, promote

    spec = PLANTED.format("stale_mask_on_replan")
    stale = UserKernel.from_spec(spec)
    planted_families._last_mask.clear()
    outcome = ALL_CHECKS["mask-replan"].judge(load_case(STALE_MASK).replace(meta={}), stale)
    assert outcome.status == "fail", outcome.message
    finding = save_finding(outcome, stale, tmp_path / "out", kernel_spec=spec)
    golden = tmp_path / "golden"
    (golden / "cases").mkdir(parents=True)
    shutil.copy(GOLDEN / "ledger.json", golden / "ledger.json")
    with pytest.raises(GoldenError, match="passes on every backend"):
        promote(finding, reason="r", issue="https://github.com/o/r/issues/1", golden_dir=golden, backends=(PLANTED.format("correct_replanned_mask"),))
    done = promote(finding, reason="keeps the mask", issue="https://github.com/o/r/issues/1", golden_dir=golden, name="stale")
    assert done.entry["check"] == "mask-replan" and done.verdicts == {spec: "fail"}
    case = load_case(done.case_path)
    assert golden_check(case, done.case_path) == "mask-replan"
    entries = load_ledger(golden / "ledger.json")
    assert lookup(entries, "stale", spec, done.entry["versions"], check="mask-replan") is not None
    with pytest.raises(GoldenError, match=r"--check: 'replan' is no check; did you mean mask-replan"):
        promote(finding, reason="r", issue="https://github.com/o/r/issues/1", golden_dir=golden, name="other", check="replan")
