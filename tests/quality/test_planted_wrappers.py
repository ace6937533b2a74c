"""The planted wrapper bug (``fuzz.quality.planted_wrappers``): FlashInfer's real decode behind glue that passes
``kv_last_page_len`` one short past the first page. On CUDA with FlashInfer: the oracle flags exactly the requests
longer than one page, and the same glue without the mistake passes the same case."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from pa_oracle.backends.user import UserKernel
from pa_oracle.fuzz.quality import planted_wrappers
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import Case, Heads, Layout, Options

needs_flashinfer = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("flashinfer") is None,
    reason="runs FlashInfer's decode wrapper: needs CUDA and flashinfer-python",
)


def _kernel(name: str) -> UserKernel:
    return UserKernel(getattr(planted_wrappers, name), name=f"{planted_wrappers.__name__}:{name}")


def test_the_wrappers_declare_a_cuda_decode_kernel_on_contiguous_pages() -> None:
    for name in ("flashinfer_decode_short_last_page", "flashinfer_decode_wrapped"):
        caps = _kernel(name).capabilities
        assert caps.devices == ("cuda",) and (caps.min_qo_len, caps.max_qo_len) == (1, 1), name
        assert caps.storages == ("contiguous",) and not caps.window_left and not caps.logits_soft_cap, name
        assert not caps.fp8_scales and caps.q_dtypes == ("bfloat16", "float16"), name


def _decode_case() -> Case:
    # request 0: 3 pages (last 8 slots); request 1: exactly one full page; request 2: 2 pages, 1 slot on the last
    layout = Layout.from_lengths([1, 1, 1], [40, 16, 17], 16, page_order=None, extra_pages=2)
    return Case(layout, Heads(14, 2, 64, 64), Options(causal=True, q_dtype="bfloat16", kv_dtype="bfloat16"))


@needs_flashinfer
def test_the_short_last_page_is_caught_and_the_right_glue_passes() -> None:
    planted = check_case(_kernel("flashinfer_decode_short_last_page"), _decode_case())
    control = check_case(_kernel("flashinfer_decode_wrapped"), _decode_case())
    assert control.status == "pass", control.message
    assert planted.status == "fail", planted.message
