from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pa_oracle.backends import get_backend
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.run.runner import check_case

from tests.fake_kernels import fake_engine_modules

ADAPTERS = [
    "vllm-flashinfer", "sglang-extend", "vllm-triton", "flash-attn3-paged", "flash-attn3-paged-split4",
    "flash-attn3-paged-aot", "flash-attn3-varlen", "flash-attn4-varlen", "flash-attn4-paged",
]
EXTRA_RULES = {
    "sglang-extend": "window_left=0", "vllm-triton": "ALiBi + sinks",
    "flash-attn3-varlen": "at least one key token", "flash-attn4-varlen": "at least one key token",
}


@pytest.mark.parametrize("name", ADAPTERS)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_adapter_agrees_with_the_oracle_through_a_cpu_stand_in(name: str, data: st.DataObject) -> None:
    with fake_engine_modules() as mp:
        backend = get_backend(name)  # after the stand-ins: sglang-extend reads the kernel's signature
        mp.setattr(type(backend), "device", property(lambda self: "cpu"))
        limits = Limits(max_batch=4, max_kv_len=48, max_qo_len=16, max_kv_heads=2, max_qo_heads=4)
        case = data.draw(cases(backend.capabilities.replace(devices=("cpu",)), limits), label="case")
        outcome = check_case(backend, case)
    if outcome.status == "unsupported" and name in EXTRA_RULES:
        assert EXTRA_RULES[name] in outcome.message, outcome.message
        return
    assert outcome.status == "pass", f"{name}: {outcome.message}"
