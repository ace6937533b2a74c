from __future__ import annotations

import pytest
import torch
from pa_oracle.backends import get_backend
from pa_oracle.backends.base import Unsupported, capture_cuda_graph
from pa_oracle.fuzz.campaign.engine import CampaignConfig, fuzz_backend
from pa_oracle.fuzz.checks.cuda_graphs import GRAPH_CHECK, PADDING_REQUESTS, SENTINEL, padded, padding_problems
from pa_oracle.fuzz.draw.strategies import Limits
from pa_oracle.oracle.case import Case, Heads, Layout, Options

from tests.quality.contract_breakers import FakeGraphKernel

CASE = Case(Layout.from_lengths([1, 3, 2], [19, 6, 4], 4, extra_pages=2), Heads(4, 2, 16, 16), Options(causal=True), seed=8)


def test_padding_adds_requests_that_own_no_page() -> None:
    big = padded(CASE, 2, uniform_qo_len=False)
    assert big.layout.kv_lens == CASE.layout.kv_lens + (0, 0) and big.layout.qo_lens == CASE.layout.qo_lens + (1, 1)
    assert big.layout.kv_indices == CASE.layout.kv_indices and big.layout.num_pages == CASE.layout.num_pages
    uniform = Case(Layout.from_lengths([3, 3], [5, 9], 4), Heads(1, 1, 8, 8))
    assert padded(uniform, 1, uniform_qo_len=True).layout.qo_lens == (3, 3, 3)


def test_padding_rows_may_stay_untouched_or_hold_zero_but_nothing_else() -> None:
    out = torch.full((5, 2, 4), SENTINEL)
    lse = torch.full((5, 2), SENTINEL)
    out[3] = 0.0
    assert padding_problems((out, lse), 3) == []
    out[4, 1, 2] = float("nan")
    lse[4, 0] = float("nan")
    problems = padding_problems((out, lse), 3)
    assert len(problems) == 2 and "1 padding rows' output overwritten" in problems[0] and "NaN" in problems[1]


def test_a_correct_graph_replay_holds() -> None:
    outcome = GRAPH_CHECK(FakeGraphKernel(), CASE)
    assert outcome.status == "pass", outcome.message
    assert "replay vs plain run: bit-exact" in outcome.message


def test_nan_written_into_padding_rows_is_caught() -> None:
    outcome = GRAPH_CHECK(FakeGraphKernel("nan_padding"), CASE)
    assert outcome.status == "fail" and "padding rows' output overwritten" in outcome.message, outcome.message
    assert outcome.message.startswith(f"replay 1 of 2 (padded with {PADDING_REQUESTS} empty requests)")


def test_a_replay_on_stale_inputs_is_caught() -> None:
    outcome = GRAPH_CHECK(FakeGraphKernel("stale_capture"), CASE)
    assert outcome.status == "fail", outcome.message
    assert "differs from the eager call" in outcome.message and "against the oracle" in outcome.message
    assert [label for label, *_ in outcome.cases] == ["original", "padded"]


def test_kernels_without_a_graph_path_say_so() -> None:
    assert GRAPH_CHECK.capabilities(get_backend("sdpa-math")) == "sdpa-math declares no CUDA-graph path"


def test_real_requests_are_drawn_with_keys_and_the_padding_needs_empty_requests() -> None:
    drawn = GRAPH_CHECK.capabilities(FakeGraphKernel())
    assert not isinstance(drawn, str) and not drawn.empty_requests and not drawn.qo_len_above_kv_len
    narrowed = FakeGraphKernel()
    narrowed.capabilities = narrowed.capabilities.replace(empty_requests=False)  # type: ignore[misc]
    assert "padding requests have kv_len 0" in GRAPH_CHECK.capabilities(narrowed)


def test_drawn_cases_hold_on_a_correct_graph_kernel() -> None:
    result = fuzz_backend(FakeGraphKernel(), CampaignConfig(isolate=False, examples=5, limits=Limits(max_batch=3, max_kv_len=30, max_qo_len=4,
                                                                                   max_kv_heads=2, max_qo_heads=4, head_dims=(8,))), check=GRAPH_CHECK)
    assert result.finding is None and result.passed == 5, result.line()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_capture_refuses_without_cuda() -> None:
    with pytest.raises(Unsupported, match="CUDA graphs need a CUDA device"):
        capture_cuda_graph(lambda: (torch.zeros(1), None))


def _available(name: str) -> object:
    backend = get_backend(name)
    reason = backend.unavailable_reason()
    if reason:
        pytest.skip(f"{name}: {reason}")
    return backend


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("name", "qo_lens", "page_size"),
    [
        ("sdpa-efficient", [1, 3, 2], 16),
        ("flashinfer-decode", [1, 1, 1], 16),
        ("flashinfer-decode-tc", [1, 1, 1], 16),
        ("flashinfer-prefill-fa2", [1, 5, 3], 16),
        ("flash-attn-kvcache", [1, 1, 1], 16),
        ("flash-attn-kvcache-paged", [2, 2, 2], 256),
    ],
)
def test_cuda_graph_replay_on_real_kernels(name: str, qo_lens: list[int], page_size: int) -> None:
    backend = _available(name)
    case = Case(Layout.from_lengths(qo_lens, [300, 17, 64], page_size, extra_pages=1), Heads(8, 2, 128, 128),
                Options(causal=True, q_dtype="bfloat16", kv_dtype="bfloat16"), seed=21)
    outcome = GRAPH_CHECK(backend, case)  # type: ignore[arg-type]
    assert outcome.status == "pass", outcome.message
