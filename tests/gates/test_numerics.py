"""The logit gate's result names torch's precision switches as they were, so that a float32 gate failing in
one process and passing in the next says whether reduced-precision matmuls were on."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="the gates need transformers (pip install 'paged-attention-oracle[test]')")

from pa_oracle.gates.logits import numerics  # noqa: E402


def test_numerics_reports_a_flipped_matmul_precision() -> None:
    before = torch.get_float32_matmul_precision()
    assert numerics()["float32_matmul_precision"] == before
    try:
        torch.set_float32_matmul_precision("medium")
        assert numerics()["float32_matmul_precision"] == "medium"
    finally:
        torch.set_float32_matmul_precision(before)
    assert numerics()["threads"] == str(torch.get_num_threads())
