"""Fixtures for the gate tests: tiny random models (CPU, float32) and a small GSM8k-format folder.

Nothing here imports transformers at collection time: the tests that need it skip without it
(``pytest.importorskip`` in their module), the others run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# Short GSM8k-style records (made up here, same fields and '#### N' ending), so the tests need no data files.
PROBLEMS = [
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "Tom has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"),
    ("A box holds 12 pens. How many pens are in 5 boxes?", "5 boxes hold 5 * 12 = <<5*12=60>>60 pens.\n#### 60"),
    ("Ann reads 15 pages a day for 6 days, then 10 more pages. How many pages did she read?",
     "In 6 days she reads 15 * 6 = <<15*6=90>>90 pages.\nIn all she reads 90 + 10 = <<90+10=100>>100 pages.\n#### 100"),
    ("A shirt costs $20 and is 25% off. What does it cost?", "The discount is 20 * 0.25 = $<<20*0.25=5>>5.\nIt costs 20 - 5 = $<<20-5=15>>15.\n#### 15"),
    ("There are 9 birds and 4 fly away. How many stay?", "9 - 4 = <<9-4=5>>5 birds stay.\n#### 5"),
]


@pytest.fixture(scope="session")
def gsm8k_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gsm8k")
    lines = [json.dumps({"question": q, "answer": a}) for q, a in PROBLEMS]
    (folder / "test.jsonl").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="session")
def tiny_llama():
    from pa_oracle.gates.models import tiny_model

    return tiny_model()  # Llama, 6 query heads / 2 KV heads: GQA ratio 3


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pa_oracle.gates.models import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny-llama"))
