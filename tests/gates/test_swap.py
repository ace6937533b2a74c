"""The attention swap: a model's attention through the canonical paged case must equal stock
transformers attention.

Bit-for-bit where the arithmetic is the same: the swapped ``sdpa-math`` backend and stock ``"sdpa"``
are compared with SDPA pinned to its MATH kernel for both (left unpinned, stock SDPA on CPU takes the
fused flash kernel, whose blocked softmax differs in the last bits: 6.8e-6 on these logits). Then a
single sequence (prefill and decode steps) and a right-padded prefill batch are identical: each
sequence's keys sit at the same offsets of a row of the same length in both, and masked keys add
exp(-inf) = 0 exactly.

Not bit-for-bit: a left-padded batch. ``backends/_dense.py`` packs every sequence's keys at the left
of its row; transformers keeps them right-aligned after the padding. The vectorized sums of the
softmax and of p @ v then group the same terms differently, which moves float32 results by a few
ulps (seen: up to 2.4e-6 on logits of magnitude 8). The test bounds that by the distance of stock
SDPA itself from the float64 oracle: the swap moves the logits less than float32 rounding does.
"""

from __future__ import annotations

import pytest
import torch
from pa_oracle.backends.base import Backend, KernelOutput
from pa_oracle.gates.models import TinySpec, tiny_model
from pa_oracle.gates.swap import (
    PagedAttention,
    SwapError,
    _check_mask,
    _mask_function,
    implementation_name,
    register_paged_attention,
    registered_swap,
    resolve_backend,
)
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

pytest.importorskip("transformers", reason="the gates need transformers (pip install 'paged-attention-oracle[test]')")

GEN = torch.Generator().manual_seed(1234)
IDS = torch.randint(3, 250, (3, 21), generator=GEN)
LEFT_PADDED = torch.ones_like(IDS)
LEFT_PADDED[1, :6], LEFT_PADDED[2, :13] = 0, 0
DECODE_TOKENS = torch.randint(3, 250, (3, 4), generator=GEN)


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(1) - 1).clamp(min=0)


def _prefill_and_decode(model, implementation: str, ids: torch.Tensor, mask: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Logits of the prefill (every position) and of each decode step, one token at a time through a cache."""
    from transformers import DynamicCache

    model.set_attn_implementation(implementation)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        out = model(ids, attention_mask=mask, position_ids=_positions(mask), past_key_values=DynamicCache(config=model.config))
        logits = [out.logits]
        for t in range(steps.shape[1]):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            position = _positions(mask)[:, -1:]
            out = model(steps[:, t : t + 1], attention_mask=mask, position_ids=position, past_key_values=out.past_key_values)
            logits.append(out.logits)
    return torch.cat(logits, 1)


def _real(logits: torch.Tensor, mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Logits at real (non-padding) tokens only: stock attention leaves garbage in padding rows."""
    return logits[torch.cat([mask, torch.ones_like(mask[:, :1]).expand(-1, steps)], 1).bool()]


ARCHITECTURES = pytest.mark.parametrize(
    "architecture, window", [("llama", None), ("qwen2", 5)], ids=["llama-gqa3", "qwen2-sliding-window-5"]
)


def _swap_and_stock(architecture: str, window: int | None, ids, mask, steps, backend: str = "sdpa-math"):
    model = tiny_model(TinySpec(architecture, sliding_window=window))
    name = register_paged_attention(backend, seed=7)
    stock = _prefill_and_decode(model, "sdpa", ids, mask, steps)
    swapped = _prefill_and_decode(model, name, ids, mask, steps)
    assert registered_swap(name).calls == model.config.num_hidden_layers * (1 + steps.shape[1])  # it really ran
    return model, _real(stock, mask, steps.shape[1]), _real(swapped, mask, steps.shape[1])


@ARCHITECTURES
def test_single_sequence_prefill_and_decode_equal_stock_bit_for_bit(architecture: str, window: int | None) -> None:
    _, stock, swapped = _swap_and_stock(architecture, window, IDS[:1], LEFT_PADDED[:1], DECODE_TOKENS[:1])
    assert torch.equal(stock, swapped), f"max |diff| {(stock - swapped).abs().max():.3g}"


@ARCHITECTURES
def test_right_padded_prefill_batch_equals_stock_bit_for_bit(architecture: str, window: int | None) -> None:
    right_padded = LEFT_PADDED.flip(1)
    _, stock, swapped = _swap_and_stock(architecture, window, IDS, right_padded, DECODE_TOKENS[:, :0])
    assert torch.equal(stock, swapped), f"max |diff| {(stock - swapped).abs().max():.3g}"


@ARCHITECTURES
def test_left_padded_batch_prefill_and_decode_match_stock_within_float32_rounding(architecture: str, window: int | None) -> None:
    model, stock, swapped = _swap_and_stock(architecture, window, IDS, LEFT_PADDED, DECODE_TOKENS)
    oracle = _real(_prefill_and_decode(model, register_paged_attention("oracle"), IDS, LEFT_PADDED, DECODE_TOKENS),
                   LEFT_PADDED, DECODE_TOKENS.shape[1])
    gap, rounding = float((swapped - stock).abs().max()), float((stock - oracle).abs().max())
    assert 0 < rounding and gap <= rounding, f"swap vs stock {gap:.3g}, stock vs float64 oracle {rounding:.3g}"


def _gap(model, implementation: str, reference: torch.Tensor) -> float:
    logits = _prefill_and_decode(model, implementation, IDS, LEFT_PADDED, DECODE_TOKENS)
    return float((_real(logits, LEFT_PADDED, DECODE_TOKENS.shape[1]) - reference).abs().max())


def test_swapped_oracle_agrees_with_stock_within_the_controls_rounding(tiny_llama) -> None:
    """flash-attn's rule, as the suite's tolerance uses it: stock float32 SDPA may be as far from the
    float64 oracle as 3x the naive float32 computation (the control) is; a wrong GQA map is far out."""
    oracle = _real(_prefill_and_decode(tiny_llama, register_paged_attention("oracle"), IDS, LEFT_PADDED, DECODE_TOKENS),
                   LEFT_PADDED, DECODE_TOKENS.shape[1])
    stock = _gap(tiny_llama, "sdpa", oracle)
    control = _gap(tiny_llama, register_paged_attention("control"), oracle)
    wrong = _gap(tiny_llama, register_paged_attention("pa_oracle.fuzz.quality.planted:wrong_gqa_map"), oracle)
    assert 0 < control and stock <= 3 * control, (stock, control)
    assert wrong > 1000 * control, (wrong, control)


def _attention_inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    b, hq, hkv, s, d = 2, 6, 2, 7, 8
    q = torch.randn(b, hq, s, d, generator=gen)
    k, v = torch.randn(b, hkv, s, d, generator=gen), torch.randn(b, hkv, s, d, generator=gen)
    padding = torch.ones(b, s, dtype=torch.bool)
    padding[1, :3] = False  # sequence 1: 4 real tokens, left-padded
    return q, k, v, padding


class _Module(torch.nn.Module):
    is_causal = True
    scaling = 0.3


def test_swap_output_is_per_sequence_attention_with_zero_padding_rows() -> None:
    q, k, v, padding = _attention_inputs()
    mask = _mask_function(batch_size=2, q_length=7, kv_length=7, attention_mask=padding)
    swap = registered_swap(register_paged_attention("oracle", page_size=3))
    out, weights = swap(_Module(), q, k, v, mask, scaling=0.3)
    assert weights is None and out.shape == (2, 7, 6, 8)
    assert torch.equal(out[1, :3], torch.zeros_like(out[1, :3]))
    for b in range(2):  # independent check: dense causal attention on each sequence's real tokens
        real = padding[b]
        expected = torch.nn.functional.scaled_dot_product_attention(
            q[b][:, real].double(), k[b][:, real].double(), v[b][:, real].double(), is_causal=True, scale=0.3, enable_gqa=True
        )
        torch.testing.assert_close(out[b, real], expected.transpose(0, 1).float(), rtol=1e-6, atol=1e-6)


def test_swap_pool_is_shuffled_and_poisoned_so_reading_past_a_sequence_shows_as_nan() -> None:
    q, k, v, padding = _attention_inputs()
    mask = _mask_function(batch_size=2, q_length=7, kv_length=7, attention_mask=padding)
    swap = registered_swap(register_paged_attention("pa_oracle.fuzz.quality.planted:reads_past_last_page", page_size=3))
    out, _ = swap(_Module(), q, k, v, mask, scaling=0.3)
    assert out.isnan().any()  # 7 and 4 tokens leave the last pages of size 3 part-filled: NaN slots


def test_mask_with_a_hole_under_a_sliding_window_is_refused() -> None:
    from transformers.masking_utils import sliding_window_causal_mask_function

    padding = torch.tensor([[True, True, False, False, True, True]])  # right-padded prompt, then decoded tokens
    mask = _mask_function(batch_size=1, q_length=2, kv_length=6, q_offset=4, attention_mask=padding,
                          mask_function=sliding_window_causal_mask_function(3))
    with pytest.raises(SwapError, match="not the canonical one"):
        _check_mask(mask, window_left=2)


def test_mask_with_a_hole_and_no_window_is_the_canonical_mask() -> None:
    padding = torch.tensor([[True, True, False, False, True, True]])
    mask = _mask_function(batch_size=1, q_length=2, kv_length=6, q_offset=4, attention_mask=padding)
    _check_mask(mask, window_left=-1)
    assert mask.query_valid.tolist() == [[True, True]]


def test_a_plain_tensor_mask_is_refused_with_the_reason() -> None:
    q, k, v, _ = _attention_inputs()
    swap = registered_swap(register_paged_attention("sdpa-math"))
    with pytest.raises(SwapError, match="not the PagedMask"):
        swap(_Module(), q, k, v, torch.ones(2, 1, 7, 7, dtype=torch.bool))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_backend_that_cannot_run_here_is_refused_by_name() -> None:
    with pytest.raises(SwapError, match="flashinfer-decode is not available here"):
        register_paged_attention("flashinfer-decode")


def test_backend_that_cannot_run_the_case_says_why() -> None:
    q, k, v, padding = _attention_inputs()
    mask = _mask_function(batch_size=2, q_length=7, kv_length=7, attention_mask=padding)
    swap = registered_swap(register_paged_attention("sdpa-math"))
    with pytest.raises(SwapError, match="logits_soft_cap"):
        swap(_Module(), q, k, v, mask, scaling=0.3, softcap=30.0)


def test_registered_name_never_reads_as_flash_attention() -> None:
    from pa_oracle.backends.user import UserKernel

    name = implementation_name(UserKernel(lambda *a, **k: None, name="pkg.flash_mod:flash_fn"), 16, 0)
    assert "flash" not in name and "/" not in name and name.startswith("pa-oracle[")
    assert resolve_backend("oracle").name == "oracle" and resolve_backend("control").name == "control"


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_through_the_swap_matches_stock(tiny_llama, cache: str) -> None:
    """generate() builds the mask ahead of the forward for a static cache; the swap's mask survives that."""
    tiny_llama.generation_config.pad_token_id = 0
    ids, mask = IDS[:2, :12], LEFT_PADDED[:2, :12].clone()
    mask[1, :4] = 0
    name = register_paged_attention("sdpa-math", seed=3)
    tokens = {}
    for implementation in ("sdpa", name):
        tiny_llama.set_attn_implementation(implementation)
        with sdpa_kernel(SDPBackend.MATH):
            tokens[implementation] = tiny_llama.generate(
                ids, attention_mask=mask, max_new_tokens=5, do_sample=False, cache_implementation=cache
            )[:, ids.shape[1] :]
    assert registered_swap(name).calls == tiny_llama.config.num_hidden_layers * 5
    assert torch.equal(tokens["sdpa"], tokens[name])


def test_a_sliced_mask_is_no_longer_the_swaps_mask() -> None:
    q, k, v, padding = _attention_inputs()
    mask = _mask_function(batch_size=2, q_length=7, kv_length=7, attention_mask=padding)
    swap = registered_swap(register_paged_attention("sdpa-math"))
    with pytest.raises(SwapError, match="not the PagedMask"):
        swap(_Module(), q, k, v, mask[:, :, :, :7])


class _HostReads(TorchFunctionMode):
    """Counts the tensor calls that wait for the device on CUDA: reading values on the host and
    indexing with a boolean mask (its size depends on the values)."""

    READS = {"tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero", "equal"}

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        indices = args[1] if name in ("__getitem__", "__setitem__") and len(args) > 1 else ()
        indices = indices if isinstance(indices, tuple) else (indices,)
        self.count += name in self.READS or any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
        return func(*args, **(kwargs or {}))


class _Zeros(Backend):
    """A backend that reads nothing (so that only the swap's own host reads are counted)."""

    name = "zeros"

    def run(self, plan, tensors):
        return KernelOutput(tensors.q.new_zeros(tensors.q.shape), None)


def _host_reads_per_forward(num_layers: int) -> tuple[int, PagedAttention]:
    model = tiny_model(TinySpec("llama", num_layers=num_layers))
    name = register_paged_attention(_Zeros(), page_size=4, seed=5)
    model.set_attn_implementation(name)
    reads = []
    with torch.no_grad():
        cache = None
        for t in range(3):  # a left-padded prefill, then decode steps through the cache
            mask = LEFT_PADDED[:, : 15 + t]
            with _HostReads() as counter:
                cache = model(IDS[:, 15 + t - 1 : 15 + t] if t else IDS[:, :15], attention_mask=mask,
                              position_ids=_positions(mask)[:, -1:] if t else _positions(mask),
                              past_key_values=cache, use_cache=True).past_key_values
            reads.append(counter.count)
    return reads, registered_swap(name)


def test_layers_share_the_forwards_page_table_and_plan_and_never_wait_on_the_device() -> None:
    few, swap_few = _host_reads_per_forward(2)
    many, swap_many = _host_reads_per_forward(5)
    assert few == many, f"host reads per forward grow with the layers: {few} with 2 layers, {many} with 5"
    assert swap_many.calls == 5 * 3 and swap_many.page_tables == 3 and swap_many.plans == 3
