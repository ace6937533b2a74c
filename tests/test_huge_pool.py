from __future__ import annotations

import pytest
import torch
from pa_oracle.backends import discover
from pa_oracle.fuzz.draw.huge import INT32_LIMIT, huge_pool_case, page_stride
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import Options


def test_huge_pool_pages_pass_the_int32_element_boundary() -> None:
    case = huge_pool_case()
    assert min(case.layout.kv_indices) * page_stride(case) > INT32_LIMIT


CUDA_BACKENDS = sorted(name for name, cls in discover().items() if "cuda" in cls.capabilities.devices)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the huge-pool tier needs a CUDA device with ~10 GiB free")
@pytest.mark.parametrize("name", CUDA_BACKENDS)
def test_huge_pool(name: str) -> None:
    backend = discover()[name]()
    if backend.unavailable_reason():
        pytest.skip(backend.unavailable_reason())
    options = Options(causal=True, q_dtype="bfloat16", kv_dtype="bfloat16")
    page = 256 if backend.capabilities.page_size_multiple == 256 else 16
    for case in (huge_pool_case(options=options, page_size=page), huge_pool_case(options=options, page_size=page, qo_lens=(1, 1, 1))):
        outcome = check_case(backend, case)
        if outcome.status == "unsupported":
            continue
        assert outcome.status == "pass", f"{name} on a {case.layout.num_pages}-page pool: {outcome.message}"
        torch.cuda.empty_cache()
