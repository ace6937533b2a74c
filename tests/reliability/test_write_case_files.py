"""``pa-oracle writes --case FILE`` reads the file strictly (issue 31): no float or bool for an int, no
unknown field, bounded sizes and a pool of at most a few GiB, refused before anything is allocated;
every refusal is exit 2 naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import pa_oracle.cli

GOOD = {"seq_lens_before": [1, 0], "append_lens": [2, 3], "page_size": 4, "num_kv_heads": 1, "head_dim": 8}


def writes_case(tmp_path: Path, data: Any) -> Any:
    path = tmp_path / "writes.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return CliRunner().invoke(pa_oracle.cli.main, ["writes", "-b", "torch-scatter", "--case", str(path)]), path


def test_a_saved_write_case_and_a_bare_one_replay(tmp_path: Path) -> None:
    for data in ({"kernel": "torch-scatter", "case": GOOD, "status": "fail", "detail": "x"}, GOOD):
        result, _ = writes_case(tmp_path, data)
        assert result.exit_code == 0, result.output
        assert "torch-scatter" in result.output and "PASS" in result.output


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"case": {**GOOD, "seq_lens_before": [1.0, 0]}}, ["case.seq_lens_before[0]", "expected int, got float 1.0"]),
        ({"case": {**GOOD, "append_lens": [True, 3]}}, ["case.append_lens[0]", "expected int, got bool"]),
        ({**GOOD, "page_size": 4.0}, ["page_size", "expected int, got float 4.0"]),
        ({**GOOD, "head_dim": True}, ["head_dim", "expected int, got bool"]),
        ({"case": {**GOOD, "combined": 1}}, ["case.combined", "expected bool, got int 1"]),
        ({"case": {**GOOD, "seed": -1}}, ["case.seed", "-1"]),
        ({"case": {**GOOD, "dtype": "float64"}}, ["case.dtype", "float64"]),
        ({"case": {**GOOD, "kv_layout": "nhd"}}, ["case.kv_layout", "nhd"]),
        ({"case": {**GOOD, "page_size": 0}}, ["case.page_size", ">= 1"]),
        ({"case": {**GOOD, "seq_lens_before": [10**12, 0]}}, ["case.seq_lens_before[0]", "<= 16777216"]),
        ({"case": {**GOOD, "num_kv_heads": 1 << 20}}, ["case.num_kv_heads", "<= 65536"]),
        ({"case": {**GOOD, "seq_lens_before": [16_000_000, 0], "num_kv_heads": 64, "head_dim": 256}}, ["GiB", "more than the 4 GiB"]),
        ({"case": {**GOOD, "page_size": 65536, "num_kv_heads": 65536, "head_dim": 65536}}, ["GiB", "pool"]),
        ({"case": {**GOOD, "append_lens": [2]}}, ["of one length"]),
        ({"case": {**GOOD, "append_lens": []}}, ["case.append_lens"]),
        ({"case": {**GOOD, "extra": 1}}, ["case.extra", "unknown field"]),
        ({"case": GOOD, "kernel": 7}, ["kernel", "expected str | null, got int 7"]),
        ({"case": {k: v for k, v in GOOD.items() if k != "head_dim"}}, ["case.head_dim", "missing"]),
        ([1], ["expected a JSON object", "got list [1]"]),
        ("{not json", ["not valid JSON"]),
        ('{"case": {}, "case": {}}', ["given twice"]),
    ],
)
def test_nonsense_write_cases_are_refused_naming_the_file_and_the_field(tmp_path: Path, data: Any, words: list[str]) -> None:
    result, path = writes_case(tmp_path, data)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    assert str(path) in result.output.replace("\n", "")
    for word in words:
        assert word in result.output, (word, result.output)
