from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pa_oracle.backends import discover, get_backend
from pa_oracle.backends.base import Backend, Capabilities, register, registered
from pa_oracle.backends.user import UserKernel, capabilities_of, declare
from pa_oracle.fuzz.draw.strategies import Limits, cases
from pa_oracle.fuzz.run.runner import check_case
from pa_oracle.oracle.case import Case, Heads, Layout, Options

ADAPTERS = sorted(discover())  # every registered adapter: a new one is tested the moment it registers


def test_discovery_finds_the_cpu_adapters() -> None:
    assert {"sdpa-math", "sdpa-flash", "flex"} <= set(discover())


def test_the_adapter_tests_are_parametrized_by_the_live_registry() -> None:
    @register
    class Newcomer(Backend):
        name = "test-newcomer"
        description = "registered by a test"
        capabilities = Capabilities()

    try:
        assert "test-newcomer" in discover() and sorted(discover()) == sorted(set(ADAPTERS) | {"test-newcomer"})
    finally:
        from pa_oracle.backends import base

        del base._REGISTRY["test-newcomer"]
    assert "test-newcomer" not in registered()


@pytest.mark.parametrize("name", ADAPTERS)
@settings(max_examples=2, deadline=None)
@given(data=st.data())
def test_every_registered_adapter_describes_itself_and_agrees_with_the_oracle(name: str, data: st.DataObject) -> None:
    cls = discover()[name]
    assert cls.name == name and cls.description, f"{name}: no description"
    backend = cls()
    reason = backend.unavailable_reason()
    if reason is not None:
        assert isinstance(reason, str) and reason.strip(), f"{name}: an unavailable adapter says why"
        return  # nothing to run here; the GPU job runs it
    limits = Limits(max_batch=2, max_kv_len=24, max_qo_len=4, max_kv_heads=2, max_qo_heads=4)
    case = data.draw(cases(backend.capabilities, limits), label="case")
    outcome = check_case(backend, case)
    if outcome.status == "fail" and (entry := _known(backend, case)) is not None:
        pytest.xfail(f"{name}: known finding {entry.case} at its installed versions: {outcome.message[:200]}")
    assert outcome.status in ("pass", "unsupported"), f"{name}: {outcome.message}"
    if outcome.status == "unsupported":
        assert outcome.message.strip(), f"{name}: a declined case says why"


def _known(backend: Backend, case: Case):  # type: ignore[no-untyped-def]
    """The ledger entry that covers ``case`` on ``backend`` at its installed versions (a known finding: the H100
    drew flashinfer-cascade's empty-request LSE sentinel, flashinfer#4401, here on 0.6.18.post1), else None."""
    from pa_oracle.fuzz.campaign.ledger import GOLDEN, known_finding, load_ledger

    return known_finding(load_ledger(GOLDEN / "ledger.json"), case, backend.name, backend.versions(), backend.kernel_family)


@pytest.mark.parametrize("name", ["sdpa-math", "sdpa-flash"])
@pytest.mark.parametrize(
    "options",
    [
        Options(causal=True, q_dtype="bfloat16", kv_dtype="bfloat16"),
        Options(causal=True, window_left=3, alibi_slopes=(0.5, 0.25, 0.125, 0.0625), q_dtype="float16", kv_dtype="float16"),
        Options(sm_scale=0.3),
    ],
)
def test_sdpa_backends_agree_on_a_ragged_batch(name: str, options: Options) -> None:
    case = Case(Layout.from_lengths([1, 0, 7, 4, 3], [33, 5, 7, 0, 2], 4, page_order=None, extra_pages=3), Heads(4, 2, 16, 16), options)
    outcome = check_case(get_backend(name), case)
    assert outcome.status == "pass", outcome.message


def test_unsupported_options_are_skipped_with_a_reason() -> None:
    case = Case(Layout.from_lengths([1], [5], 4), Heads(1, 1, 8, 8), Options(logits_soft_cap=30.0))
    outcome = check_case(get_backend("sdpa-math"), case)
    assert outcome.status == "unsupported" and "logits_soft_cap" in outcome.message


@pytest.mark.slow
def test_flex_compiled_agrees_with_every_option() -> None:
    flex = get_backend("flex")
    case = Case(
        Layout.from_lengths([1, 0, 9, 3], [40, 3, 9, 0], 8, extra_pages=2), Heads(4, 2, 16, 8),
        Options(causal=True, window_left=5, logits_soft_cap=30.0, alibi_slopes=(0.5, 0.25, 0.125, 0.0625), q_dtype="bfloat16", kv_dtype="bfloat16"),
    )
    outcome = check_case(flex, case)
    assert outcome.status == "pass", outcome.message


def test_crash_is_a_finding_not_a_skip() -> None:
    def broken(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def refuses(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
        raise NotImplementedError("head_dim 8 not built")

    case = Case(Layout.from_lengths([1], [5], 4), Heads(1, 1, 8, 8))
    assert check_case(UserKernel(broken), case).status == "crash"
    assert check_case(UserKernel(refuses), case).status == "unsupported"


def test_a_kernel_that_writes_its_inputs_fails() -> None:
    def scribbles(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
        k_cache.zero_()
        return torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype)

    case = Case(Layout.from_lengths([1], [0], 4, extra_pages=1), Heads(1, 1, 8, 8))
    outcome = check_case(UserKernel(scribbles), case)
    assert outcome.status == "fail" and "modified its inputs: k_cache" in outcome.message


def test_user_capabilities_come_from_the_signature_and_declare() -> None:
    @declare(q_dtypes=("bfloat16",), page_sizes=(16,))
    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale):
        raise AssertionError

    caps = capabilities_of(kernel)
    assert caps.causal == (False, True) and caps.custom_sm_scale and not caps.window_left and not caps.logits_soft_cap
    assert caps.q_dtypes == ("bfloat16",) and caps.page_sizes == (16,) and not caps.fp8_scales
    with pytest.raises(TypeError, match="unknown capability fields"):
        declare(page_size=16)
    with pytest.raises(ValueError, match="must accept keyword arguments"):
        capabilities_of(lambda q, k, v: q)


def _every_adapter():
    return [cls() for _, cls in sorted(discover().items())]


@pytest.mark.parametrize("backend", _every_adapter(), ids=lambda b: b.name)
def test_every_adapter_declares_a_contract_its_capabilities_keep(backend) -> None:
    import dataclasses

    from pa_oracle.backends.base import Capabilities

    contract, caps = backend.contract, backend.capabilities
    assert caps.soft_cap_alibi_order == contract.soft_cap_alibi_order, "the strategies must draw the library's own order"
    neutral = Capabilities()
    for pre in contract.preconditions:  # a precondition is a capability that excludes the case
        assert getattr(caps, pre.capability) != getattr(neutral, pre.capability), f"{pre.capability} is not restricted"
    assert backend.kernel_family and dataclasses.is_dataclass(contract)


def test_a_precondition_says_why_the_case_is_outside_the_contract() -> None:
    from pa_oracle.backends.sglang_triton import SglangDecode

    case = Case(Layout.from_lengths([1, 1], [0, 3], 4), Heads(1, 1, 16, 16), Options(q_dtype="float16", kv_dtype="float16"))
    reason = SglangDecode().unsupported_reason(case)
    assert reason is not None and "empty request" in reason and "get_cuda_graph_seq_len_fill_value" in reason


def test_flashinfer_runs_its_own_soft_cap_alibi_order() -> None:
    from pa_oracle.backends.flashinfer import FlashInferDecode

    both = Options(logits_soft_cap=30.0, alibi_slopes=(0.5,), q_dtype="float16", kv_dtype="float16")
    case = Case(Layout.from_lengths([1], [3], 16), Heads(1, 1, 64, 64), both)
    assert "order cap-then-alibi" in FlashInferDecode().unsupported_reason(case)
    flashinfer_order = case.replace(options=Options(**{**both.__dict__, "soft_cap_alibi_order": "alibi-then-cap"}))
    assert FlashInferDecode().capabilities.unsupported_reason(flashinfer_order) is None
    conversions = FlashInferDecode().conversions(flashinfer_order)
    assert any("base 2" in c for c in conversions) and any("alibi-then-cap" in c for c in conversions)


def test_the_strategies_draw_the_kernel_order_only_where_it_matters() -> None:
    from hypothesis import given, settings
    from pa_oracle.backends.flashinfer import FlashInferDecode
    from pa_oracle.fuzz.draw.strategies import cases

    seen = []

    @settings(max_examples=60, database=None, derandomize=True)
    @given(cases(FlashInferDecode.capabilities))
    def draw(case: Case) -> None:
        both = case.options.logits_soft_cap > 0 and case.options.alibi_slopes is not None
        assert case.options.soft_cap_alibi_order == ("alibi-then-cap" if both else "cap-then-alibi")
        seen.append(both)

    draw()
    assert any(seen)


def _fake_flash_attn_lse(case: Case, shifted: bool) -> torch.Tensor:
    from pa_oracle.oracle.reference import reference
    from pa_oracle.oracle.tensors import make_tensors

    lse = reference(case, make_tensors(case)).lse.float()
    lay, slopes = case.layout, case.options.alibi_slopes
    position = torch.tensor([k - q + i for q, k in zip(lay.qo_lens, lay.kv_lens) for i in range(q)], dtype=torch.float32)
    return torch.where(torch.isinf(lse), lse, lse + position[:, None] * torch.tensor(slopes)) if shifted else lse


@pytest.mark.parametrize(("causal", "window_left", "shifted"), [(True, -1, True), (True, 2, False), (True, 50, True), (False, -1, False)])
def test_flash_attn_undoes_its_causal_alibi_lse_shift(causal: bool, window_left: int, shifted: bool) -> None:
    from pa_oracle.backends.flash_attn import FlashAttnKvCache, FlashAttnVarlenPaged

    options = Options(causal=causal, window_left=window_left, alibi_slopes=(0.5, 0.25), q_dtype="float16", kv_dtype="float16")
    case = Case(Layout.from_lengths([2, 2, 1], [5, 2, 0], 256), Heads(2, 1, 64, 64), options)
    for adapter in (FlashAttnVarlenPaged(), FlashAttnKvCache()):
        assert adapter.alibi_lse_shifted(case) is shifted  # the causal kernel (Is_causal) adds slope * j to every row
        kernel_lse = _fake_flash_attn_lse(case, shifted)
        torch.testing.assert_close(adapter._natural_lse(case, kernel_lse), _fake_flash_attn_lse(case, False))
        assert any("ALiBi LSE shift" in c for c in adapter.conversions(case)) is shifted


def test_the_failure_report_lists_the_conversions_applied() -> None:
    from pa_oracle.backends.flashinfer import FlashInferDecode
    from pa_oracle.oracle.report import format_report

    case = Case(Layout.from_lengths([1], [3], 16), Heads(1, 1, 64, 64), Options(alibi_slopes=(0.5,), q_dtype="float16", kv_dtype="float16"))
    verdict = check_case(get_backend("sdpa-math"), case).verdict
    report = format_report(case, "flashinfer-decode", verdict, conversions=FlashInferDecode().conversions(case))
    assert "- kernel conventions converted by the adapter: LSE base 2 -> natural log; ALiBi LSE shift undone" in report
    assert "converted by the adapter" not in format_report(case, "sdpa-math", verdict)


def test_a_drawn_case_a_ledger_entry_covers_names_the_entry() -> None:
    """The xfail above names the entry (``Entry.case``; the H100 met ``entry.name``, an AttributeError, on a drawn
    empty request of flashinfer-decode-tc's family)."""

    class Decode(Backend):
        name, description, family, capabilities = "flashinfer-decode-tc", "a stand-in", "flashinfer-decode-tensor-core", Capabilities()

        def versions(self) -> dict[str, str]:
            return {"flashinfer": "0.6.18.post1"}

    empty = Case(Layout((0, 1), (0, 0), (), (0,), 16, 1), Heads(2, 1, 16, 16))  # a query and no key
    entry = _known(Decode(), empty)
    assert entry is not None and entry.case == "flashinfer-decode-empty-request-lse"
    assert _known(Decode(), empty.replace(layout=Layout((0, 1), (0, 1), (0,), (3,), 16, 1))) is None
