from __future__ import annotations

import json

from click.testing import CliRunner

from pa_oracle.cli import main


def test_env_lists_backends_as_json() -> None:
    result = CliRunner().invoke(main, ["env", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["backends"]["sdpa-math"]["available"] is True
    assert info["oracle"]["cpu"] == "torch"  # the fused engine is CUDA-only


def test_fuzz_correct_cpu_kernels_exits_zero(tmp_path) -> None:
    result = CliRunner().invoke(main, ["fuzz", "-b", "sdpa-math", "-b", "sdpa-flash", "-n", "40", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert [r["examples"] for r in summary] == [40, 40] and all(r["finding"] is None for r in summary)


def test_fuzz_finding_exits_one_with_repro(tmp_path) -> None:
    result = CliRunner().invoke(main, ["fuzz", "-k", "pa_oracle.fuzz.quality.planted:wrong_gqa_map", "-n", "100", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "repro:  pa-oracle replay" in result.output and "--kernel pa_oracle.fuzz.quality.planted:wrong_gqa_map" in result.output


def test_unknown_backend_suggests_a_close_name() -> None:
    result = CliRunner().invoke(main, ["fuzz", "-b", "sdpa-mat"])
    assert result.exit_code == 2 and "did you mean sdpa-math" in result.output


def test_bad_kernel_spec_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["fuzz", "-k", "no_colon_here"])
    assert result.exit_code == 2 and "MODULE:FUNCTION" in result.output


def test_replay_refuses_a_malformed_case(tmp_path) -> None:
    (tmp_path / "case.json").write_text(json.dumps({"schema_version": 7}))
    result = CliRunner().invoke(main, ["replay", str(tmp_path / "case.json"), "-b", "sdpa-math"])
    assert result.exit_code == 2 and "unknown case schema_version 7" in result.output  # bad input, not a finding


def test_only_narrows_what_is_drawn_and_refuses_to_widen(tmp_path) -> None:
    from pa_oracle.backends import get_backend
    from pa_oracle.fuzz.cli import narrow

    backend = narrow(get_backend("sdpa-math"), ("head_dims=64,128", "q_dtypes=bfloat16", "alibi=false", "max_group_size=4"))
    caps = backend.capabilities
    assert caps.head_dims == (64, 128) and caps.q_dtypes == ("bfloat16",) and not caps.alibi and caps.max_group_size == 4
    result = CliRunner().invoke(main, ["fuzz", "-b", "sdpa-math", "--only", "logits_soft_cap=true"])
    assert result.exit_code == 2 and "widens" in result.output
    result = CliRunner().invoke(main, ["fuzz", "-b", "sdpa-math", "--only", "nonsense=1"])
    assert result.exit_code == 2 and "FIELD=VALUES" in result.output


def test_a_campaign_writes_nothing_into_the_working_directory_but_its_out(tmp_path) -> None:
    import os
    import subprocess
    import sys

    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("HYPOTHESIS_STORAGE_DIRECTORY", None)
    run = subprocess.run([sys.executable, "-m", "pa_oracle", "fuzz", "-b", "sdpa-math", "-n", "3", "--out", "found"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(p.name for p in work.iterdir()) == ["found"], "no .hypothesis/ (or anything else) beside --out"
