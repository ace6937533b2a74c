"""Tiny test models: the spec refuses shapes its architecture lacks, and builds what it says."""

from __future__ import annotations

import pytest
import torch
from pa_oracle.gates.models import TinySpec, tiny_model

pytest.importorskip("transformers", reason="the gates need transformers (pip install 'paged-attention-oracle[test]')")


def test_the_spec_refuses_what_its_architecture_lacks() -> None:
    with pytest.raises(ValueError, match="Llama has no sliding window"):
        TinySpec("llama", sliding_window=8)
    with pytest.raises(ValueError, match="architecture must be one of"):
        TinySpec("gpt2")


def test_tiny_model_has_the_specs_shape_dtype_and_seeded_weights() -> None:
    model = tiny_model(TinySpec("qwen2", num_layers=3, sliding_window=8), seed=1, dtype=torch.bfloat16)
    config = model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (3, 6, 2)
    assert config.sliding_window == 8 and config.use_sliding_window and not model.training
    assert next(model.parameters()).dtype == torch.bfloat16
    again, other = tiny_model(seed=0), tiny_model(seed=1)
    assert torch.equal(tiny_model().lm_head.weight, again.lm_head.weight)
    assert not torch.equal(again.lm_head.weight, other.lm_head.weight)
