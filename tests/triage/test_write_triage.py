"""Triage of a write finding (issue 34: "findings and triage as for attention kernels"): each planted write bug found
by ``pa-oracle writes --kernel`` on the CPU is triaged by ``pa-oracle triage``: reproduced, minimized by the one
minimizer to no more requests and tokens, localized to the right kind of wrong bytes, its minimal case saved as a
``writes.json`` that replay reads and that a correct kernel passes; a folder that is no finding is bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pa_oracle.backends.writes import WriteBackend
from pa_oracle.cli import main
from pa_oracle.fuzz.campaign.findings import publish_write_finding
from pa_oracle.fuzz.campaign.minimize import minimize_write, signature
from pa_oracle.fuzz.checks.append import as_outcome, judge_write
from pa_oracle.fuzz.quality import planted_writes
from pa_oracle.fuzz.triage.writes import localize_write, read_write_finding, write_judge
from pa_oracle.oracle.append import AppendCase

PLANTED = "pa_oracle.fuzz.quality.planted_writes"
PLACEMENT = {"placement", "not written"}  # a lost write shows as "not written" when a later token overwrote it
# planted bug -> (the kinds its wrong bytes may have, a kind they must include)
KINDS: dict[str, tuple[set[str], set[str]]] = {
    "OneSlotPast": (PLACEMENT, {"placement"}),
    "IgnoresLastPageLen": (PLACEMENT, {"not written"}),
    "LayoutConfusion": (PLACEMENT, {"placement"}),
    "AssumesContiguous": (PLACEMENT, {"placement"}),
    "NewSlotsContiguous": (PLACEMENT, {"placement"}),
    "NextSlotLenModPage": (PLACEMENT, {"placement"}),
    "CompactedRequestIndex": (PLACEMENT, {"placement"}),
    "StoresNextPow2Heads": ({"canary written", "value"}, set()),
    "PaddingToLastSlot": ({"padding written"}, {"padding written"}),
    "InverseScale": ({"value"}, {"value"}),
}


def _bug_names() -> list[str]:
    names = [cls.__name__ for cls in (*planted_writes.BUGS, *planted_writes.UPSTREAM_BUGS, *planted_writes.NEW_DRAW_BUGS)]
    assert sorted(names) == sorted(KINDS), "every planted write bug has its expected kinds here"
    return names


@pytest.mark.parametrize("bug", _bug_names())
def test_a_planted_write_bug_found_by_writes_is_triaged(bug: str, tmp_path: Path) -> None:
    spec = f"{PLANTED}:{bug}"
    found = CliRunner().invoke(main, ["writes", "--kernel", spec, "-n", "200", "--no-isolate", "--out", str(tmp_path / "o")])
    assert found.exit_code == 1, found.output
    folder = next((tmp_path / "o").glob("*/writes.json")).parent
    original = read_write_finding(folder / "writes.json").case
    run = CliRunner().invoke(main, ["triage", str(folder), "--kernel", spec, "--json"])
    assert run.exit_code == 1, run.output
    summary = json.loads(run.output[run.output.index("{"):])
    assert summary["reproduced"] and summary["status"] == "fail"
    minimal = read_write_finding(folder / "triage" / "minimized" / "writes.json")
    assert minimal.meta.found_by is not None and minimal.meta.found_by.command == "pa-oracle triage"
    assert minimal.meta.minimized_from == original.case_id and minimal.meta.kernel == spec
    case = minimal.case
    assert case.batch_size <= original.batch_size and case.total_appended <= original.total_appended
    allowed, required = KINDS[bug]
    kinds = set(summary["localization"]["original case"]["kinds"])
    assert kinds and kinds <= allowed and required <= kinds, kinds
    assert set(localize_write(case, WriteBackend(getattr(planted_writes, bug)()))
               .kinds) <= allowed  # the minimal case fails the same way
    assert judge_write(case, planted_writes.QuantisingLoop()).ok, "a correct kernel passes the minimal case"
    report = (folder / "triage" / "triage.md").read_text()
    assert "REPRODUCED" in report and f"pa-oracle replay {folder / 'triage' / 'minimized'} --kernel {spec}" in report
    replayed = CliRunner().invoke(main, ["replay", str(folder / "triage" / "minimized"), "--kernel", spec])
    assert replayed.exit_code == 1 and "FAIL" in replayed.output, replayed.output


BIG = AppendCase(seq_lens_before=(3, 4, 0, 5, 8, 2), append_lens=(2, 3, 4, 1, 5, 2), page_size=4, num_kv_heads=2, head_dim=8)


def test_ddmin_drops_the_requests_a_placement_bug_does_not_need() -> None:
    """len % page: only a request whose last page is full (before 4 or 8 of page 4) shows it; one token is enough."""
    backend = WriteBackend(planted_writes.NextSlotLenModPage())
    with write_judge(backend, lambda _: None) as judge:
        result = minimize_write(judge, BIG, budget=100)
    case = result.work.case
    assert case.batch_size == 1 and case.append_lens == (1,), case.summary()
    assert case.seq_lens_before[0] in (4, 8) and result.signature.kinds == {"not written", "placement"} or \
        result.signature.kinds == {"placement"}, (case.summary(), result.signature)
    assert [s.kind for s in result.steps][0] == "requests" and result.runs <= 100
    assert judge_write(case, planted_writes.PerTokenLoop()).ok
    loc = localize_write(case, backend)
    # the first new token overwrote slot 0 of the full page: the right value at the wrong slot
    wrong_slot = [r for r in loc.rows if r.kind == "placement"]
    assert wrong_slot and all(r.request is None and r.slot == 0 for r in wrong_slot)
    assert all(r.value_at is not None for r in loc.rows if r.kind == "not written")


def test_a_reduction_that_fails_another_way_is_not_taken() -> None:
    """The same failure: a value bug's candidates must keep failing by value (the signature's kinds)."""
    backend = WriteBackend(planted_writes.NextSlotLenModPage())
    with write_judge(backend, lambda _: None) as judge:
        outcome = judge(BIG)
    assert signature(outcome).kinds <= {"placement", "not written"} and "wrong bytes: " in outcome.message
    kinds = lambda line: signature(dataclasses.replace(outcome, message=f"3 rows differ\n{line}"))  # noqa: E731
    assert not kinds("wrong bytes: value").reproduced_by(kinds("wrong bytes: placement"))
    assert kinds("wrong bytes: placement, not written").reproduced_by(kinds("wrong bytes: not written"))
    assert not kinds("wrong bytes: placement").reproduced_by(signature(dataclasses.replace(outcome, message="mutated: x")))
    passing = BIG.replace(seq_lens_before=(3, 5, 0, 5, 9, 2))  # no request's last page is full
    with write_judge(backend, lambda _: None) as judge:
        assert judge(passing).status == "pass"
        with pytest.raises(ValueError, match="does not fail"):
            minimize_write(judge, passing)


def _saved(tmp_path: Path, kernel: planted_writes.WriteKernel, user: bool = True) -> Path:
    backend = WriteBackend(kernel, user=user)
    outcome = as_outcome(judge_write(BIG, kernel), backend.name)
    return publish_write_finding(outcome, backend, tmp_path)[0]


def test_a_finding_a_correct_kernel_does_not_fail_is_not_reproduced(tmp_path: Path) -> None:
    folder = _saved(tmp_path, planted_writes.NextSlotLenModPage())
    run = CliRunner().invoke(main, ["triage", str(folder / "writes.json"), "--kernel", f"{PLANTED}:PerTokenLoop"])
    assert run.exit_code == 0 and "NOT REPRODUCED" in run.output, run.output
    assert "NOT REPRODUCED" in (folder / "triage" / "triage.md").read_text()


def test_a_user_kernel_is_named_never_imported_and_bad_input_is_exit_2(tmp_path: Path) -> None:
    folder = _saved(tmp_path, planted_writes.NextSlotLenModPage())
    record = json.loads((folder / "writes.json").read_text())["meta"]["found_by"]["kernel"]
    unnamed = CliRunner().invoke(main, ["triage", str(folder)])
    assert unnamed.exit_code == 2 and f"--kernel {record}" in unnamed.output, unnamed.output
    (tmp_path / "empty").mkdir()
    empty = CliRunner().invoke(main, ["triage", str(tmp_path / "empty"), "--kernel", f"{PLANTED}:PerTokenLoop"])
    assert empty.exit_code == 2 and "case.json" in empty.output and str(tmp_path / "empty") in empty.output, empty.output
    broken = tmp_path / "broken"
    broken.mkdir()
    data = json.loads((folder / "writes.json").read_text())
    data["case"]["append_lens"] = [1, -1]
    (broken / "writes.json").write_text(json.dumps(data))
    bad = CliRunner().invoke(main, ["triage", str(broken), "--kernel", f"{PLANTED}:PerTokenLoop"])
    assert bad.exit_code == 2 and str(broken / "writes.json") in bad.output, bad.output


def test_a_library_write_kernel_its_record_names_is_run_by_name(tmp_path: Path) -> None:
    """A finding whose record names a registered write kernel runs there without -b (torch-scatter is correct:
    not reproduced, exit 0); -b names another one."""
    folder = _saved(tmp_path, planted_writes.NextSlotLenModPage(), user=False)
    data = json.loads((folder / "writes.json").read_text())
    data["meta"]["found_by"]["backend"] = "torch-scatter"
    (folder / "writes.json").write_text(json.dumps(data))
    run = CliRunner().invoke(main, ["triage", str(folder), "--json"])
    assert run.exit_code == 0, run.output
    summary = json.loads(run.output[run.output.index("{"):])
    assert summary["backend"] == "torch-scatter" and not summary["reproduced"] and summary["minimized"] is None
    other = CliRunner().invoke(main, ["triage", str(folder), "-b", "sdpa-math"])
    assert other.exit_code == 2 and "not a write kernel" in other.output, other.output


CRASHY = '''
from pa_oracle.fuzz.quality.planted_writes import PerTokenLoop


class RaisesOnTwoTokens(PerTokenLoop):
    name = "raises-on-two-tokens"

    def append(self, case, inputs):
        if case.total_appended >= 2:
            raise ValueError("two tokens")
        super().append(case, inputs)
'''


def test_a_crash_is_reproduced_and_minimized_as_the_same_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pa_oracle.backends.writes.user import user_write_kernel

    module = f"write_triage_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(CRASHY)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = f"{module}:RaisesOnTwoTokens"
    backend = WriteBackend(user_write_kernel(spec), user=True)
    outcome = as_outcome(judge_write(BIG, backend.kernel), backend.name)
    assert outcome.status == "crash"
    folder = publish_write_finding(outcome, backend, tmp_path / "o")[0]
    run = CliRunner().invoke(main, ["triage", str(folder), "--kernel", spec, "--json"])
    assert run.exit_code == 1, run.output
    summary = json.loads(run.output[run.output.index("{"):])
    assert summary["reproduced"] and summary["status"] == "crash" and summary["localization"] == {}
    case = read_write_finding(folder / "triage" / "minimized" / "writes.json").case
    assert case.batch_size == 1 and case.total_appended == 2, case.summary()
    assert "ValueError" in (folder / "triage" / "triage.md").read_text()
