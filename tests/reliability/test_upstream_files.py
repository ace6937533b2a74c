"""``triage --upstream DIR`` never replaces a file it did not write (issue 31): a repro.py written by hand,
someone's own ISSUE.md, a file edited since it was written are kept, with a message naming each, and
nothing is written; an ISSUE.md's hand-written title and ``## Why`` are carried into the new one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.triage.upstream import HAND_WRITTEN, RECORD, Seen, UpstreamFileKept, write_upstream
from pa_oracle.oracle.case import Case, Heads, Layout, Options

from pa_oracle.cli import main

CASE = Case(Layout.from_lengths([2, 3], [12, 12], 4), Heads(2, 1, 16, 16), Options(q_dtype="float16", kv_dtype="float16"), seed=3)
KERNEL = "tests.reliability.bad_kernels:slightly_off"
SEEN = Seen("fail", "FAIL: out max error 0.01 > 0.001 allowed")


def _write(folder: Path) -> dict[str, Path]:
    return write_upstream(folder, CASE, UserKernel.from_spec(KERNEL), SEEN)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize(("name", "text", "why"), [
    ("repro.py", f'"""A minimal repro.\n\n{HAND_WRITTEN} some-case.\n"""\nprint("mine")\n', "repro.py (written by hand for the maintainers)"),
    ("repro.py", "print('my own script')\n", "repro.py (not written by pa-oracle, or edited since it was)"),
    ("ISSUE.md", "# my notes\n\nnothing generated here\n", "ISSUE.md (not written by pa-oracle, or edited since it was)"),
    ("inputs.npz", "not ours", "inputs.npz (not written by pa-oracle, or edited since it was)"),
])
def test_a_file_it_did_not_write_is_kept_and_nothing_is_written(tmp_path: Path, name: str, text: str, why: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "up"
    folder.mkdir()
    (folder / name).write_text(text)
    before = _snapshot(folder)
    if name == "inputs.npz":  # only written beside a repro whose tensors are too large to embed: make it so
        monkeypatch.setattr("pa_oracle.fuzz.triage.upstream.EMBED_LIMIT", 16)
    with pytest.raises(UpstreamFileKept) as kept:
        _write(folder)
    assert why in str(kept.value) and "Move them away or give another --upstream folder" in str(kept.value), str(kept.value)
    assert _snapshot(folder) == before, "a file was written or replaced"


def test_its_own_files_are_replaced_and_an_edited_one_is_kept(tmp_path: Path) -> None:
    folder = tmp_path / "up"
    written = _write(folder)
    record = json.loads((folder / RECORD).read_text())
    assert set(record) == {"repro.py", "ISSUE.md"} and set(written) == {"repro", "issue"}
    _write(folder)  # its own, unchanged since: replaced
    (folder / "repro.py").write_text((folder / "repro.py").read_text() + "# a fix of mine\n")
    edited = _snapshot(folder)
    with pytest.raises(UpstreamFileKept, match=r"repro.py \(not written by pa-oracle, or edited since it was\)"):
        _write(folder)
    assert _snapshot(folder) == edited


def test_a_hand_written_why_and_title_are_carried_into_the_new_issue(tmp_path: Path) -> None:
    folder = tmp_path / "up"
    folder.mkdir()
    (folder / "ISSUE.md").write_text("# My title for the maintainers\n\nold body\n\n## Why\n\nBecause the tile floor drops a row.\n")
    _write(folder)
    issue = (folder / "ISSUE.md").read_text()
    assert issue.startswith("# My title for the maintainers\n") and issue.rstrip().endswith("Because the tile floor drops a row.")
    assert "## Minimal case" in issue and "old body" not in issue and (folder / "repro.py").exists()


def test_triage_upstream_keeps_a_hand_written_repro_and_says_so(tmp_path: Path) -> None:
    case_path = CASE.save(tmp_path / "case.json")
    up = tmp_path / "up"
    up.mkdir()
    mine = f'"""x\n\n{HAND_WRITTEN} some-case.\n"""\n'
    (up / "repro.py").write_text(mine)
    result = CliRunner().invoke(main, ["triage", str(case_path), "-k", KERNEL, "--no-minimize", "--out", str(tmp_path / "t"),
                                       "--upstream", str(up)])
    assert result.exit_code == 1, result.output  # the kernel fails the case: a finding, whatever the repro
    assert "repro.py (written by hand for the maintainers)" in result.output, result.output
    assert (up / "repro.py").read_text() == mine and not (up / "ISSUE.md").exists()
