"""``pa-oracle gate logits`` end to end on a tiny model saved to disk."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pa_oracle.cli import main

pytest.importorskip("transformers", reason="the gates need transformers (pip install 'paged-attention-oracle[test]')")


def _logits(tiny_dir, gsm8k_dir, *args: str):
    return CliRunner().invoke(
        main, ["gate", "logits", "--model", str(tiny_dir), "--data", str(gsm8k_dir), "--limit", "3", "--batch-size", "2",
               "--device", "cpu", "--dtype", "float32", *args]
    )


def test_correct_backend_passes_and_writes_its_report(tiny_dir, gsm8k_dir, tmp_path) -> None:
    result = _logits(tiny_dir, gsm8k_dir, "--backend", "sdpa-math", "--reference", "oracle", "--json", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["passed"] is True and summary["texts"] == 3 and summary["dtype"] == "float32"
    assert summary["numerics"]["float32_matmul_precision"] == "highest"  # what the float32 thresholds assume
    assert json.loads((tmp_path / "result.json").read_text()) == summary
    assert "PASS" in (tmp_path / "report.md").read_text()


def test_decode_mode_reports_progress_in_forward_passes(tiny_dir, gsm8k_dir) -> None:
    result = _logits(tiny_dir, gsm8k_dir, "--backend", "sdpa-math", "--mode", "decode", "--limit", "1")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if "forward passes" in line]
    assert len(lines) == 10 and lines[-1].startswith("scoring: ")  # every 10%, in a log (not a terminal)
    done, total = lines[-1].removeprefix("scoring: ").split(" ")[0].split("/")
    assert done == total and int(total) > 20  # the reference's and the backend's prompt and decode steps


def test_planted_bug_fails_with_exit_code_one(tiny_dir, gsm8k_dir) -> None:
    result = _logits(tiny_dir, gsm8k_dir, "--backend", "pa_oracle.fuzz.quality.planted:wrong_gqa_map", "--padding", "right")
    assert result.exit_code == 1, result.output
    assert "FAIL: mean KL" in result.stdout and "right-padded" in result.stdout


def test_bad_inputs_are_usage_errors(tiny_dir, gsm8k_dir, tmp_path) -> None:
    missing_model = _logits(tmp_path / "nothing-here", gsm8k_dir, "--backend", "sdpa-math")
    assert missing_model.exit_code == 2 and "cannot load model" in missing_model.output
    unknown = _logits(tiny_dir, gsm8k_dir, "--backend", "sdpa-mat")
    assert unknown.exit_code == 2 and "did you mean sdpa-math" in unknown.output
    no_data = _logits(tiny_dir, tmp_path, "--backend", "sdpa-math")
    assert no_data.exit_code == 2 and "test.jsonl" in no_data.output


def test_logit_gate_data_has_no_default_folder(tiny_dir) -> None:
    """No default may point at a folder of the developers' machine: --data is required."""
    result = CliRunner().invoke(main, ["gate", "logits", "--model", str(tiny_dir), "--backend", "sdpa-math"])
    assert result.exit_code == 2 and "Missing option '--data'" in result.output


def test_settings_the_gate_cannot_run_are_refused_before_the_model_loads(gsm8k_dir, tmp_path) -> None:
    never_loaded = tmp_path / "nothing-here"
    prefill = _logits(never_loaded, gsm8k_dir, "--backend", "sdpa-math", "--prefill", "oracle")
    assert prefill.exit_code == 2 and "prefill= names the prefill backend of decode mode" in prefill.output, prefill.output
    batch = _logits(never_loaded, gsm8k_dir, "--backend", "sdpa-math", "--batch-size", "0")
    assert batch.exit_code == 2 and "need batch_size >= 1" in batch.output, batch.output


def test_the_gates_bad_input_is_the_one_bad_input_class() -> None:
    from pa_oracle.gates import gsm8k
    from pa_oracle.gates.errors import GateInputError
    from pa_oracle.oracle.errors import BadInput

    assert gsm8k.GateInputError is GateInputError and issubclass(GateInputError, BadInput)


def test_a_refusal_keeps_its_quotes(tiny_dir, gsm8k_dir) -> None:
    unknown = _logits(tiny_dir, gsm8k_dir, "--backend", "sdpa-mat")
    assert "Error: unknown backend 'sdpa-mat'; did you mean sdpa-math" in unknown.output, unknown.output


def test_a_bad_shard_is_quoted_whole() -> None:
    pytest.importorskip("lm_eval", reason="the GSM8k gate needs lm-eval (pip install 'paged-attention-oracle[eval]')")
    shard = CliRunner().invoke(main, ["gate", "gsm8k", "--model", "m", "--backend", "oracle", "--shard", "1of4"])
    assert shard.exit_code == 2 and "got '1of4'" in shard.output, shard.output
