"""Write kernels on the campaign engine (issues 32 and 34): the write check draws the cases the old write
campaign drew, finds planted bugs with crashes and hangs isolated, resumes, skips what a ledger entry of the write
check covers, publishes the finding record that ``pa-oracle replay`` reads, and the one registry knows both kinds."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from pa_oracle.backends import available, get_backend, names
from pa_oracle.backends.writes import WriteBackend
from pa_oracle.backends.writes.user import user_write_kernel
from pa_oracle.cli import main
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend, run_campaign
from pa_oracle.fuzz.campaign.state import CampaignState
from pa_oracle.fuzz.checks.append import WRITE
from pa_oracle.fuzz.quality import planted_writes

PLANTED = "pa_oracle.fuzz.quality.planted_writes"
# the first 50 case ids the old write campaign (fuzz.campaign.writes.fuzz_write_kernel, before the engine) drew on
# seed 0, in-process, for torch-scatter and for planted_writes.QuantisingLoop (fp8 and padding declared): the same
OLD_SEED_0 = [
    "764fefd9979c", "84556442bdd1", "d4ee2cd66b1a", "24a558863cf9", "a9542ea0c9a1",
    "725c79c8e2f5", "1f06a22683c5", "bb5bd7d526f3", "6d070df63389", "50ec72af1432",
    "990ea67bb6b4", "2efa7d58213d", "992da102d99b", "b4114d59cd64", "6bef918d25ba",
    "ef3fad0fc0e4", "760ff1566799", "a8acb8ddc06b", "b653bdc70f4a", "849ffba865d9",
    "0a983d4572f2", "b822efb8803b", "852bc444ef29", "21f004f1b714", "8ddff0eb3c49",
    "6d678c98fdeb", "5550653cec63", "b845b3a12322", "a0f9f0124f8a", "41da9f5baa93",
    "bd8a2ae7d392", "df150bea1fc9", "0b89a72dc465", "c5ae828a9d5e", "b2a022bd60a2",
    "022a6973e61f", "61f027406ee4", "53863bcaedd2", "169e67df1dde", "30f6700e9c91",
    "337186211abc", "3551135c5df1", "ec986a5bb1da", "2bdbfd878249", "4040bf586f9c",
    "a00f5db17eba", "2503e4a94387", "e8a910e49c83", "ffeec9e7f32e", "56829bcd218b",
]
KERNELS = """
    import os, time

    def exits_hard(key, value, k_cache, v_cache, *, slot_mapping):
        os._exit(7)

    def hangs(key, value, k_cache, v_cache, *, slot_mapping):
        time.sleep(3600)
"""


def _config(**changes: object) -> CampaignConfig:
    return CampaignConfig(checks=(WRITE,), pipeline=False, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize("kernel", [lambda: get_backend("torch-scatter"), lambda: WriteBackend(planted_writes.QuantisingLoop())])
def test_seed_0_draws_the_cases_the_old_write_campaign_drew(kernel) -> None:  # type: ignore[no-untyped-def]
    result = fuzz_backend(kernel(), _config(examples=50, seed=0, isolate=False), check=WRITE)
    assert result.status == "done" and result.examples == 50 and result.seen == OLD_SEED_0


def test_a_planted_bug_is_found_isolated_through_the_engine(tmp_path: Path) -> None:
    backend = WriteBackend(user_write_kernel(f"{PLANTED}:OneSlotPast"), user=True)
    result = fuzz_backend(backend, _config(examples=100, isolate=True, out_dir=tmp_path), check=WRITE)
    assert result.status == "finding" and result.finding is not None and result.finding.status == "fail"
    assert result.finding_dir is not None and (result.finding_dir / "writes.json").is_file()
    assert result.repro is not None and f"--kernel {PLANTED}:OneSlotPast" in result.repro


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"engine_writes_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(KERNELS))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_kernel_that_kills_its_process_or_hangs_is_a_finding_and_the_campaign_goes_on(user_module: str, tmp_path: Path) -> None:
    backends = [WriteBackend(user_write_kernel(f"{user_module}:{fn}"), user=True) for fn in ("exits_hard", "hangs")]
    backends.append(get_backend("torch-scatter"))
    state = CampaignState({"seed": 0})
    results = run_campaign(backends, state, tmp_path / "state.json", _config(examples=30, isolate=True, case_timeout=1))
    died, hung, clean = results
    assert died.status == "finding" and died.findings[0].status == "crash" and "exit code 7" in died.findings[0].message
    assert hung.status == "finding" and hung.findings[0].message.startswith("hang:")
    assert clean.status == "done" and clean.examples == 30 and not clean.findings


def test_a_resumed_write_campaign_continues_with_new_cases(tmp_path: Path) -> None:
    path, backend = tmp_path / "state.json", get_backend("torch-scatter")
    first = run_campaign([backend], CampaignState({"seed": 0}), path, _config(examples=30, isolate=False))[0]
    kept = list(first.seen)
    again = run_campaign([backend], CampaignState.load(path), path, _config(examples=60, isolate=False))[0]
    assert again.examples == 60 and again.seen[:30] == kept and len(set(again.seen)) == 60


LEDGER = {"schema_version": 2, "entries": [{
    "case": "write-combined-pools", "backends": ["torch-scatter"], "versions": {}, "status": "tolerated",
    "reason": "a known class of write cases (test)", "issue": "https://github.com/example/repo/issues/1",
    "check": "write", "matches": {"combined": True}}]}


def test_a_ledger_entry_of_the_write_check_skips_the_cases_it_covers(tmp_path: Path) -> None:
    from pa_oracle.fuzz.campaign.ledger import load_ledger

    (tmp_path / "ledger.json").write_text(json.dumps(LEDGER))
    ledger = load_ledger(tmp_path / "ledger.json")
    judged: list[bool] = []
    real = WRITE.judge

    class Watching(type(WRITE)):  # type: ignore[misc]
        def judge(self, case, backend, tolerance=None, keep_output=False):  # type: ignore[no-untyped-def]
            judged.append(case.combined)
            return real(case, backend)

    check = Watching()
    result = fuzz_backend(get_backend("torch-scatter"), CampaignConfig(checks=(check,), pipeline=False, examples=40,
                                                                      isolate=False, ledger=ledger), check=check)
    assert result.skipped_known > 0 and judged and not any(judged), (result.skipped_known, judged)
    code = CliRunner().invoke(main, ["writes", "-b", "torch-scatter", "-n", "30", "--no-isolate", "--out", str(tmp_path / "o"),
                                     "--ledger", str(tmp_path / "ledger.json")])
    state = json.loads((tmp_path / "o" / "writes-state.json").read_text())["backends"]["torch-scatter:write"]
    assert code.exit_code == 0 and state["skipped_known"] > 0, code.output


def test_a_write_entry_names_write_features_only(tmp_path: Path) -> None:
    from pa_oracle.fuzz.campaign.ledger import load_ledger
    from pa_oracle.oracle.case import CaseError

    bad = json.loads(json.dumps(LEDGER))
    bad["entries"][0]["matches"] = {"alibi": True}
    (tmp_path / "ledger.json").write_text(json.dumps(bad))
    with pytest.raises(CaseError, match="unknown feature 'alibi'"):
        load_ledger(tmp_path / "ledger.json")


def test_replay_reads_a_write_finding(tmp_path: Path) -> None:
    spec = f"{PLANTED}:OneSlotPast"
    run = CliRunner().invoke(main, ["writes", "--kernel", spec, "-n", "50", "--no-isolate", "--out", str(tmp_path / "o")])
    assert run.exit_code == 1, run.output
    folder = next((tmp_path / "o").glob("*/writes.json")).parent
    record = json.loads((folder / "writes.json").read_text())["meta"]["found_by"]
    assert record["command"] == "pa-oracle writes" and record["check"] == "write" and record["kernel"] == spec
    replayed = CliRunner().invoke(main, ["replay", str(folder), "--kernel", spec])
    assert replayed.exit_code == 1 and "FAIL" in replayed.output, replayed.output
    unnamed = CliRunner().invoke(main, ["replay", str(folder)])
    assert unnamed.exit_code == 2 and f"--kernel {spec}" in unnamed.output, unnamed.output


def test_one_registry_knows_both_kinds() -> None:
    kinds = names()
    assert kinds["torch-scatter"] == "write" and kinds["sdpa-math"] == "attention"
    assert get_backend("torch-scatter").kind == "write" and get_backend("sdpa-math").kind == "attention"
    both, _ = available(None)
    assert {"torch-scatter", "sdpa-math"} <= {b.name for b in both}
    assert all(b.kind == "attention" for b in available()[0])
    env = CliRunner().invoke(main, ["env"])
    assert env.exit_code == 0 and any(line.split()[:1] == ["torch-scatter"] and line.endswith("(write kernel)")
                                      for line in env.output.splitlines()), env.output


def test_a_kernel_of_the_other_kind_is_refused_by_name(tmp_path: Path) -> None:
    fuzz = CliRunner().invoke(main, ["fuzz", "-b", "torch-scatter", "-n", "5", "--out", str(tmp_path / "f")])
    assert fuzz.exit_code == 2 and "pa-oracle writes -b torch-scatter" in fuzz.output, fuzz.output
    writes = CliRunner().invoke(main, ["writes", "-b", "sdpa-math", "-n", "5", "--out", str(tmp_path / "w")])
    assert writes.exit_code == 2 and "pa-oracle fuzz -b sdpa-math" in writes.output, writes.output


def test_the_write_check_does_not_apply_to_an_attention_kernel() -> None:
    started = time.monotonic()
    result = fuzz_backend(get_backend("sdpa-math"), _config(examples=5, isolate=False), check=WRITE)
    assert result.not_applicable is not None and "attention kernel" in result.not_applicable and result.examples == 0
    assert time.monotonic() - started < 30
