"""``pa-oracle writes`` is ``pa-oracle fuzz --check write`` with the write defaults (issues 32 and 34): the same
cases, state file and lines either way; options of the attention draws refused by name; ``--workers N`` shards
whose cases add up and whose finding is the run's; ``--json``; no draw processes for a write campaign."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from pa_oracle.backends import get_backend
from pa_oracle.cli import main
from pa_oracle.fuzz.campaign.engine import CampaignConfig, run_campaign
from pa_oracle.fuzz.campaign.state import CampaignState
from pa_oracle.fuzz.checks.append import WRITE, WRITE_CHECK
from pa_oracle.fuzz.cli import WRITE_CHECK_NAME, WRITES_CAMPAIGN
from pa_oracle.fuzz.write_cli import STATE_FILE

PLANTED = "pa_oracle.fuzz.quality.planted_writes"
# a write kernel that is wrong in shard 0 of 2 only (run in the shard's process: --no-isolate), right elsewhere
SHARD_BUG = """
    import sys

    import torch

    def wrong_in_shard_0(key, value, k_cache, v_cache, *, slot_mapping):
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        if "0/2" in sys.argv:  # the worker's --shard 0/2
            slots = slots.flip(0)
        pages, offsets = slots // k_cache.shape[1], slots % k_cache.shape[1]
        k_cache[pages, offsets] = key[keep].to(k_cache.dtype)
        v_cache[pages, offsets] = value[keep].to(v_cache.dtype)
"""


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def _state(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(path.read_text())


def test_the_names_agree() -> None:
    assert WRITE_CHECK_NAME == WRITE_CHECK and STATE_FILE == f"{WRITES_CAMPAIGN}.json"


def test_fuzz_check_write_is_writes(tmp_path: Path) -> None:
    code_w, out_w = _run("writes", "-b", "torch-scatter", "-n", "40", "--no-isolate", "--out", str(tmp_path / "w"))
    code_f, out_f = _run("fuzz", "--check", "write", "-b", "torch-scatter", "-n", "40", "--no-isolate",
                         "--out", str(tmp_path / "f"))
    assert code_w == code_f == 0, (out_w, out_f)
    seen_w = _state(tmp_path / "w" / STATE_FILE)["backends"]["torch-scatter:write"]["seen"]
    seen_f = _state(tmp_path / "f" / STATE_FILE)["backends"]["torch-scatter:write"]["seen"]
    assert len(seen_w) == 40 and seen_w == seen_f
    for output in (out_w, out_f):
        assert any(line.startswith("torch-scatter") and " ok   40 examples, " in line for line in output.splitlines()), output
        assert "time: " in output and "coverage" not in output.lower(), output
    assert f"pa-oracle writes --resume --out {tmp_path / 'w'}" in out_w
    assert f"pa-oracle fuzz -c write --resume --out {tmp_path / 'f'}" in out_f
    code, output = _run("fuzz", "-c", "write", "--resume", "-n", "60", "--no-isolate", "--out", str(tmp_path / "w"))
    again = _state(tmp_path / "w" / STATE_FILE)["backends"]["torch-scatter:write"]["seen"]
    assert code == 0 and again[:40] == seen_w and len(set(again)) == 60, output


def test_a_saved_write_case_replays_through_either_command(tmp_path: Path) -> None:
    spec = f"{PLANTED}:OneSlotPast"
    code, output = _run("writes", "--kernel", spec, "-n", "50", "--no-isolate", "--out", str(tmp_path / "o"))
    assert code == 1 and " FAIL fail (after " in output and "    saved " in output, output
    saved = next((tmp_path / "o").glob("*/writes.json"))
    for command in (["writes"], ["fuzz", "-c", "write"]):
        code, output = _run(*command, "--kernel", spec, "--case", str(saved), "--no-isolate")
        assert code == 1 and "FAIL: " in output, (command, output)
    code, output = _run("fuzz", "-c", "write", "-b", "torch-scatter", "--case", str(saved), "--json")
    assert code == 0 and json.loads(output) == [{"backend": "torch-scatter", "message": json.loads(output)[0]["message"],
                                                 "status": "pass"}], output


@pytest.mark.parametrize("option", [["--only", "head_dims=64"], ["--max-batch", "3"], ["--max-kv-len", "40"],
                                    ["--compile-budget", "5"]], ids=lambda o: o[0])
def test_attention_options_are_refused_by_name_for_the_write_check(option: list[str], tmp_path: Path) -> None:
    code, output = _run("fuzz", "-c", "write", "-b", "torch-scatter", "-n", "5", *option, "--out", str(tmp_path / "o"))
    assert code == 2 and option[0] in output and "not for write kernels" in output, output
    assert not (tmp_path / "o").exists()
    code, output = _run("writes", "-b", "torch-scatter", *option, "--out", str(tmp_path / "o"))
    assert code == 2 and "No such option" in output, output  # writes has none of them


def test_the_write_check_runs_alone(tmp_path: Path) -> None:
    code, output = _run("fuzz", "-c", "write", "-c", "oracle", "-b", "torch-scatter", "--out", str(tmp_path / "o"))
    assert code == 2 and "run it alone" in output, output
    code, output = _run("fuzz", "-c", "writ", "--out", str(tmp_path / "o"))
    assert code == 2 and "did you mean write" in output, output


def test_writes_json(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["writes", "-b", "torch-scatter", "-n", "30", "--no-isolate", "--json", "--out",
                                       str(tmp_path / "o")])
    code, output = result.exit_code, result.output
    rows = json.loads(result.stdout)  # (the progress and the folder's line go to stderr)
    assert code == 0 and [(r["backend"], r["check"], r["examples"], r["violation"]) for r in rows] == [
        ("torch-scatter", "write", 30, None)], output


def test_workers_forward_the_write_check_and_its_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pa_oracle.fuzz.run.workers as workers

    asked: list[list[str]] = []

    def run_workers(args: list[str], count: int, gpus: object, extra_env: object = None) -> list[int]:
        asked.append(list(args))
        return [2] * count  # bad input in every worker: no state, the run says so

    monkeypatch.setattr(workers, "run_workers", run_workers)
    monkeypatch.chdir(tmp_path)
    code, output = _run("writes", "-b", "torch-scatter", "--workers", "2", "--seed", "3")
    args = asked[0]
    assert code == 2 and "shard 0/2 exited with 2" in output, output
    pairs = {(a, b) for a, b in zip(args, args[1:])}
    assert {("--check", "write"), ("--backend", "torch-scatter"), ("--seed", "3"), ("--out", "pa-findings/writes"),
            ("--case-timeout", "60.0")} <= pairs and "--workers" not in args, args


@pytest.fixture
def shard_bug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"shard_bug_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(SHARD_BUG))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{__import__('os').environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:wrong_in_shard_0"


def test_workers_shards_add_up_and_one_shards_finding_is_the_runs(shard_bug: str, tmp_path: Path) -> None:
    out = tmp_path / "o"
    code, output = _run("writes", "-b", "torch-scatter", "--kernel", shard_bug, "-n", "60", "--workers", "2",
                        "--no-isolate", "--out", str(out))
    assert code == 1, output
    shards = [_state(out / "shards" / f"{WRITES_CAMPAIGN}-{i}-of-2.json")["backends"] for i in range(2)]
    scatter = [s["torch-scatter:write"]["seen"] for s in shards]
    assert [len(seen) for seen in scatter] == [30, 30] and not set(scatter[0]) & set(scatter[1])
    user = [s[f"{shard_bug}:write"] for s in shards]
    assert user[0]["status"] == "finding" and user[1]["status"] == "done" and not user[1]["findings"], user
    lines = output.splitlines()
    assert any(line.startswith("torch-scatter") and " ok   60 examples" in line for line in lines), output
    assert any(line.startswith(shard_bug) and " FAIL fail (after " in line for line in lines), output
    assert "    saved " in output and next(out.glob("*/writes.json")).is_file()
    code, output = _run("writes", "--merge", "--out", str(out))
    assert code == 1 and " FAIL fail (after " in output, output


def test_a_write_campaign_starts_no_draw_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pa_oracle.fuzz.campaign import drawers

    started: list[int] = []
    monkeypatch.setattr(drawers.Drawers, "start", lambda self: started.append(self.count))
    config = CampaignConfig(checks=(WRITE,), examples=30, isolate=True, case_timeout=60, pipeline=True)
    result = run_campaign([get_backend("torch-scatter")], CampaignState({"seed": 0}), tmp_path / "s.json", config)[0]
    assert result.status == "done" and result.examples == 30 and started == []
