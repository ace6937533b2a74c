"""A case the oracle could not judge is saved under ``--out`` as ``BACKEND/unjudged-CASE_ID/``
(``pa_oracle.fuzz.campaign.findings.save_unjudged``): replaying its case.json re-runs it as the
campaign ran it (its user kernel, its check), and a folder that cannot be written leaves the tool
error reported as it was, never another failure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pa_oracle.fuzz.run.runner
import pytest
from click.testing import CliRunner
from pa_oracle.backends import get_backend
from pa_oracle.backends.user import UserKernel
from pa_oracle.cli import main
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
from pa_oracle.fuzz.campaign.finding_record import read_meta
from pa_oracle.fuzz.campaign.findings import save_unjudged
from pa_oracle.fuzz.campaign.ledger import golden_check
from pa_oracle.fuzz.draw.strategies import Limits
from pa_oracle.fuzz.run.runner import Outcome
from pa_oracle.oracle.case import Case, Heads, Layout
from pa_oracle.oracle.tensors import load_case

MODULE = "tests.reliability.bad_kernels"
TINY = Limits(max_batch=2, max_kv_len=12, max_qo_len=4, max_kv_heads=2, max_qo_heads=4, head_dims=(8, 16))


def _oracle_breaks_on_the_second_case(monkeypatch: pytest.MonkeyPatch) -> list[Case]:
    """The cases judged, as they come; judging the second raises (a stand-in for an oracle bug)."""
    real, seen = pa_oracle.fuzz.run.runner.judge, []

    def breaks(case: Case, *args: Any, **kwargs: Any) -> Any:
        seen.append(case)
        if len(seen) == 2:
            raise RuntimeError("an oracle bug")
        return real(case, *args, **kwargs)

    monkeypatch.setattr(pa_oracle.fuzz.run.runner, "judge", breaks)
    return seen


def test_the_unjudged_case_is_the_one_the_oracle_broke_on_and_nothing_else_is_touched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a tool error is never a finding, but its case must come back (a GPU run's log may cut the message)
    seen = _oracle_breaks_on_the_second_case(monkeypatch)
    (tmp_path / "mine.txt").write_text("the user's")
    result = fuzz_backend(UserKernel.from_spec(f"{MODULE}:correct"), CampaignConfig(examples=10, limits=TINY, isolate=False, out_dir=tmp_path))
    assert result.status == "incomplete" and not result.findings
    (folder,) = tmp_path.glob("*/unjudged-*")
    saved = load_case(folder / "case.json")
    assert (saved.layout, saved.heads, saved.options) == (seen[1].layout, seen[1].heads, seen[1].options)
    assert "RuntimeError: an oracle bug" in (folder / "error.txt").read_text()
    assert (tmp_path / "mine.txt").read_text() == "the user's"


def test_a_user_kernels_unjudged_case_replays_on_that_kernel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _oracle_breaks_on_the_second_case(monkeypatch)
    result = fuzz_backend(UserKernel.from_spec(f"{MODULE}:correct"), CampaignConfig(examples=10, limits=TINY, isolate=False, out_dir=tmp_path))
    (folder,) = tmp_path.glob("*/unjudged-*")
    assert result.status == "incomplete" and f"(saved in {folder})" in result.notes[-1]
    assert read_meta(load_case(folder / "case.json").meta, folder).kernel == f"{MODULE}:correct"
    assert (folder / "error.txt").read_text().startswith(f"To re-run it: pa-oracle replay {folder / 'case.json'} --kernel {MODULE}:correct")
    monkeypatch.undo()  # the replay judges with the real oracle: the case passes
    replayed = CliRunner().invoke(main, ["replay", str(folder / "case.json"), "--kernel", f"{MODULE}:correct", "--json"])
    assert replayed.exit_code == 0, replayed.output
    assert json.loads(replayed.output)["status"] == "pass"


def _case() -> Case:
    return Case(Layout.from_lengths([2], [5], 4), Heads(2, 1, 8, 8), seed=3)


def test_an_unjudged_case_of_a_check_replays_through_that_check(tmp_path: Path) -> None:
    backend = get_backend("sdpa-math")
    outcome = Outcome(_case(), backend.name, "error", "the worker failed to judge the case: ValueError: x\nTraceback ...", check="relabel")
    folder = save_unjudged(outcome, backend, tmp_path)
    saved = load_case(folder / "case.json")
    assert golden_check(saved, folder / "case.json") == "relabel"  # what pa-oracle replay judges it through
    first = (folder / "error.txt").read_text().splitlines()[0]
    assert first == f"To re-run it: pa-oracle metamorphic --case {folder / 'case.json'} --check relabel --backend sdpa-math"


def test_an_unwritable_out_keeps_the_tool_error_as_the_note(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _oracle_breaks_on_the_second_case(monkeypatch)
    out = tmp_path / "a-file"
    out.write_text("the user's")
    result = fuzz_backend(get_backend("sdpa-math"), CampaignConfig(examples=10, limits=TINY, isolate=False, out_dir=out))
    assert result.status == "incomplete" and not result.findings
    assert f"(not saved under {out}: " in result.notes[-1] and "RuntimeError: an oracle bug" in result.notes[-1]
    assert out.read_text() == "the user's"


def test_the_same_case_unjudged_again_is_the_folder_already_saved(tmp_path: Path) -> None:
    backend = get_backend("sdpa-math")
    first = save_unjudged(Outcome(_case(), backend.name, "error", "the oracle could not judge the output: E"), backend, tmp_path)
    (first / "notes.txt").write_text("the user's")
    again = save_unjudged(Outcome(_case(), backend.name, "error", "the oracle could not judge the output: E"), backend, tmp_path)
    other = save_unjudged(Outcome(_case(), backend.name, "error", "the oracle could not judge the output: F"), backend, tmp_path)
    assert again == first and (first / "notes.txt").read_text() == "the user's"
    assert other == first.with_name(first.name + "-2") and "F" in (other / "error.txt").read_text()
