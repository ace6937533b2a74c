"""The logit gate on a real model: SmolLM2-135M-Instruct (Q4_1 GGUF, 9 query / 3 KV heads), float32 on
CPU. Skips unless the file is present: ``PA_ORACLE_SMOLLM2_GGUF``, ``.device/`` of this checkout
(``../shared/device/stage.sh model``) or ``/tmp/smollm2.gguf`` (the H200 staging path)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pa_oracle.gates.data import Problem
from pa_oracle.gates.logits import LogitGateConfig, gsm8k_texts, run_logit_gate
from pa_oracle.gates.models import load_model

from .conftest import PROBLEMS

pytest.importorskip("transformers", reason="the gates need transformers (pip install 'paged-attention-oracle[test]')")
pytest.importorskip("gguf", reason="GGUF loading needs the gguf package (pip install 'paged-attention-oracle[eval]')")

CANDIDATES = [
    os.environ.get("PA_ORACLE_SMOLLM2_GGUF", ""),
    str(Path(__file__).resolve().parents[2] / ".device" / "smollm2-135m-instruct-q4_1.gguf"),
    "/tmp/smollm2.gguf",
]
GGUF = next((Path(c) for c in CANDIDATES if c and Path(c).is_file()), None)


@pytest.fixture(scope="module")
def smollm2():
    if GGUF is None:
        pytest.skip(f"no SmolLM2 GGUF file at any of {[c for c in CANDIDATES if c]}")
    return load_model(GGUF, gguf_file=GGUF, dtype="float32", attn_implementation="sdpa", device="cpu")


@pytest.mark.slow  # loading and dequantizing the GGUF takes 40 s or more on 2 CPU cores
@pytest.mark.parametrize(
    "backend, passes", [("sdpa-math", True), ("pa_oracle.fuzz.quality.planted:wrong_gqa_map", False)], ids=["sdpa-math", "wrong-gqa-map"]
)
def test_smollm2_logit_gate(smollm2, backend: str, passes: bool) -> None:
    assert smollm2.model.config.num_attention_heads // smollm2.model.config.num_key_value_heads == 3
    texts = gsm8k_texts([Problem(q, a) for q, a in PROBLEMS[:3]])
    result = run_logit_gate(smollm2.model, smollm2.tokenizer, texts, LogitGateConfig(backend, reference="oracle", batch_size=3))
    assert result.passed is passes, result.to_markdown()
