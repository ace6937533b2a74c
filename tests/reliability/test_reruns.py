"""The README's main command run again (issue 35): with the default --out a new run gets a fresh
``pa-findings/run-*`` folder beside the kept campaign (nothing replaced or deleted); an --out the user
gave keeps the refusal (exit 2, naming the folder and --resume/--overwrite); every run, with findings or
without, ends by naming the folder it wrote."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import pa_oracle.cli

TINY = ["--max-batch", "2", "--max-kv-len", "12"]


def fuzz(*args: str) -> Result:
    return CliRunner().invoke(pa_oracle.cli.main, ["fuzz", *TINY, *args])


def named_folder(result: Result) -> Path:
    found = re.findall(r"^campaign folder: (\S+) \(continue it: pa-oracle fuzz --resume --out (\S+)\)$", result.output, re.M)
    assert len(found) == 1 and found[0][0] == found[0][1], result.output
    return Path(found[0][0])


def test_a_rerun_with_the_default_out_goes_to_a_fresh_folder_and_keeps_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = fuzz("-b", "sdpa-math", "-n", "3")
    assert first.exit_code == 0, first.output
    assert named_folder(first) == Path("pa-findings")
    kept = {p.name: p.read_bytes() for p in Path("pa-findings").glob("*.json")}
    assert set(kept) == {"campaign.json", "summary.json"}

    folders = []
    for _ in range(2):
        again = fuzz("-b", "sdpa-math", "-n", "3")
        assert again.exit_code == 0, again.output
        assert "pa-findings holds an earlier campaign (kept): this run writes" in again.output
        folders.append(named_folder(again))
    assert all(f.parent == Path("pa-findings") and re.fullmatch(r"run-\d{8}-\d{6}(-\d+)?", f.name) for f in folders), folders
    assert folders[0] != folders[1], "each run its own folder, even within one second"
    for folder in folders:
        assert json.loads((folder / "summary.json").read_text())[0]["examples"] == 3
    assert {p.name: p.read_bytes() for p in Path("pa-findings").glob("*.json")} == kept, "the first campaign is untouched"


def test_an_out_the_user_gave_keeps_the_refusal(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    assert fuzz("-b", "sdpa-math", "-n", "2", "--out", str(out)).exit_code == 0
    before = (out / "campaign.json").read_bytes()
    again = fuzz("-b", "sdpa-math", "-n", "2", "--out", str(out))
    assert again.exit_code == 2, again.output
    assert f"{out} holds a campaign" in again.output and "--resume" in again.output and "--overwrite" in again.output
    assert "campaign folder:" not in again.output
    assert (out / "campaign.json").read_bytes() == before and not list(out.glob("run-*"))


def test_resume_with_the_default_out_continues_pa_findings_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert fuzz("-b", "sdpa-math", "-n", "2").exit_code == 0
    more = fuzz("-b", "sdpa-math", "-n", "4", "--resume")
    assert more.exit_code == 0, more.output
    assert named_folder(more) == Path("pa-findings") and not list(Path("pa-findings").glob("run-*"))
    assert json.loads(Path("pa-findings/summary.json").read_text())[0]["examples"] == 4


def test_json_output_stays_json_and_the_folder_is_named_on_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = fuzz("-b", "sdpa-math", "-n", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["backend"] == "sdpa-math"
    assert "campaign folder: pa-findings" in result.stderr


def test_a_run_with_a_finding_names_its_folder_too(tmp_path: Path) -> None:
    out = tmp_path / "found"
    result = fuzz("-k", "pa_oracle.fuzz.quality.planted:wrong_gqa_map", "-n", "60", "--out", str(out))
    assert result.exit_code == 1, result.output
    assert named_folder(result) == out and list(out.rglob("report.md"))
    assert result.output.rstrip().splitlines()[-1].startswith("campaign folder: "), "the last line names the folder"


def test_workers_write_their_shards_into_the_fresh_folder(tmp_path: Path) -> None:
    """--workers forwards the chosen run folder: the shards' states land in it, not in the kept campaign."""
    import os
    import subprocess
    import sys

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pa_oracle", "fuzz", "-b", "sdpa-math", "-n", "4", "--workers", "2", *TINY],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ})

    first = run()
    assert first.returncode == 0, first.stderr[-2000:]
    kept = sorted(p.name for p in (tmp_path / "pa-findings" / "shards").iterdir())
    second = run()
    assert second.returncode == 0, second.stderr[-2000:]
    (folder,) = (tmp_path / "pa-findings").glob("run-*")
    assert f"campaign folder: pa-findings/{folder.name}" in second.stdout
    assert sorted(p.name for p in (folder / "shards").iterdir()) == kept, "both shards wrote into the run folder"
    assert sorted(p.name for p in (tmp_path / "pa-findings" / "shards").iterdir()) == kept
    assert json.loads((folder / "summary.json").read_text())[0]["examples"] == 4


def test_metamorphic_reruns_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    def run() -> Result:
        return CliRunner().invoke(pa_oracle.cli.main, ["metamorphic", "-b", "sdpa-math", "--check", "alone", "-n", "2"])

    first = run()
    assert first.exit_code == 0, first.output
    assert "campaign folder: pa-findings (continue it: pa-oracle metamorphic --resume --out pa-findings)" in first.output
    kept = Path("pa-findings/checks.json").read_bytes()
    again = run()
    assert again.exit_code == 0, again.output
    (folder,) = Path("pa-findings").glob("run-*")
    assert f"campaign folder: {folder} (continue it: pa-oracle metamorphic --resume --out {folder})" in again.output
    assert (folder / "checks.json").is_file() and Path("pa-findings/checks.json").read_bytes() == kept
    mine = CliRunner().invoke(pa_oracle.cli.main, ["metamorphic", "-b", "sdpa-math", "--check", "alone", "-n", "2", "--out", "pa-findings"])
    assert mine.exit_code == 2 and "pa-findings holds a campaign" in mine.output, mine.output
