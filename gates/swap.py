"""Run a transformers model's attention through a backend adapter of this suite, on a paged KV pool.

``register_paged_attention(backend)`` registers an attention function and a mask function with
transformers under one name; a model loaded (or switched, ``model.set_attn_implementation``) to that
name sends every attention call here. Per call, the padded batch becomes the suite's canonical
ragged case: the real (unpadded) query tokens in CSR ``qo_indptr`` order, each sequence's real keys
written into a page pool with a seeded random page table (unused pages and slots NaN), bottom-right
causal alignment. The backend runs that case; its ragged output is scattered back to the padded
``[B, S, Hq, D]`` layout transformers expects (padding rows zero). As in a serving engine, the page
table and the backend's plan are made once per forward and shared by its layers (each layer still
gets its own freshly poisoned pool); after that one host sync a layer call never waits on the device.

The mask function hands the attention function the 2-D padding mask together with the 4-D boolean
mask transformers would give SDPA; before the first layer uses a mask, the canonical case's own
mask (causal over the compacted real tokens, sliding window) is checked against it, so a model
whose mask the canonical case cannot express (packed or bidirectional blocks, holes between real
tokens under a sliding window) fails loudly instead of silently attending differently.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from pa_oracle.backends import get_backend
from pa_oracle.backends.base import Backend, Capabilities, KernelOutput
from pa_oracle.backends.user import UserKernel, load_kernel
from pa_oracle.gates.errors import GateInputError
from pa_oracle.oracle.case import Case, Heads, Layout, Options
from pa_oracle.oracle.reference import plain_attention, reference
from pa_oracle.oracle.tensors import POISON, Tensors, token_slots, upload

STOCK_PREFIX = "hf:"  # "hf:sdpa", "hf:eager": transformers' own implementation, not swapped


class SwapError(RuntimeError):
    """The model's attention call cannot be expressed as (or run as) a canonical paged case."""


class KernelFailed(SwapError):
    """A backend raised, or returned an output of the wrong shape, inside the model's forward (``backend``: its
    name). The backend under the gate broke its contract: the gate fails (exit 1), as ``pa-oracle fuzz`` counts
    both as findings; any other (the reference) failing is no verdict on it (exit 3)."""

    def __init__(self, message: str, backend: str) -> None:
        super().__init__(message)
        self.backend = backend


class OracleBackend(Backend):
    """The float64 oracle as a backend, its output cast to the model's dtype (not in the fuzz
    registry: fuzzing the oracle against itself proves nothing)."""

    name = "oracle"
    description = "pa_oracle.oracle.reference in float64, cast to the query dtype"
    capabilities = Capabilities()

    def run(self, plan: Case, tensors: Tensors) -> KernelOutput:
        ref = reference(plan, tensors)
        return KernelOutput(ref.out.to(tensors.q.dtype), ref.lse.float())


class ControlBackend(Backend):
    """The suite's *control* as a backend: the naive computation with every step in the model's
    dtype (``pa_oracle.oracle.reference.plain_attention``, flash-attn's ``upcast=False`` reference). Real
    kernels keep fp32 accumulators and round less; the gate's thresholds are calibrated on it."""

    name = "control"
    description = "plain attention, every step in the query dtype"
    capabilities = Capabilities()

    def run(self, plan: Case, tensors: Tensors) -> KernelOutput:
        out, lse = plain_attention(plan, tensors, tensors.q.dtype)
        return KernelOutput(out.to(tensors.q.dtype), lse.float())


_BUILT_IN = {OracleBackend.name: OracleBackend, ControlBackend.name: ControlBackend}


def resolve_backend(spec: str | Backend | Callable[..., Any]) -> Backend:
    """A backend from a registry name, ``"oracle"``, ``"control"``, ``MODULE:NAME`` (a user kernel function or
    a ``Backend`` class or instance, e.g. ``pa_oracle.fuzz.quality.planted:drops_last_key_past_1024``), a function,
    or a ``Backend`` instance; raises ``SwapError`` if it cannot run on this machine."""
    if isinstance(spec, Backend):
        backend = spec
    elif callable(spec):
        backend = UserKernel(spec)
    elif spec in _BUILT_IN:
        backend = _BUILT_IN[spec]()
    elif ":" in spec:
        loaded = load_kernel(spec)  # a Backend (class or instance) or a user kernel function
        if isinstance(loaded, type) and issubclass(loaded, Backend):
            backend = loaded()
        elif isinstance(loaded, Backend):
            backend = loaded
        else:
            backend = UserKernel(loaded, name=spec)
    else:
        backend = get_backend(spec)
    reason = backend.unavailable_reason()
    if reason:
        raise SwapError(f"backend {backend.name} is not available here: {reason}")
    return backend


class PagedMask(torch.Tensor):
    """transformers' own boolean SDPA mask [B, 1, S, L] (True: attend), carrying what the swap needs
    besides: ``key_valid`` [B, L] marks real (non-padding) keys; query ``i``'s own token is key
    ``query_key_offset + i``.

    A tensor, so that transformers passes a precomputed one through untouched (``generate`` builds
    the mask ahead of the forward for static caches). Any operation on it gives a plain tensor,
    which the swap refuses: a mask that was sliced or combined is no longer this one.
    """

    # torch's documented switch-off for a subclass; torch's stubs type it as a plain function, the base's as a classmethod
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]
    key_valid: torch.Tensor
    query_key_offset: int
    checked_windows: set[int]  # window_left values already checked against the canonical mask
    pagings: dict[int, _Paging]  # the page table each swap (by id) drew for this forward

    @staticmethod
    def wrap(allowed: torch.Tensor, key_valid: torch.Tensor, query_key_offset: int) -> PagedMask:
        mask = torch.Tensor._make_subclass(PagedMask, allowed)
        mask.key_valid, mask.query_key_offset, mask.checked_windows = key_valid, query_key_offset, set()
        mask.pagings = {}
        return mask

    @property
    def allowed(self) -> torch.Tensor:
        return self.as_subclass(torch.Tensor)

    @property
    def query_valid(self) -> torch.Tensor:
        s = self.shape[2]
        return self.key_valid[:, self.query_key_offset : self.query_key_offset + s]


def _mask_function(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: Callable[..., Any] | None = None,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
    **kwargs: Any,
) -> PagedMask:
    """transformers' mask interface (called once per forward and mask type, with the arguments it
    gives every mask function): SDPA's boolean mask, never skipped, plus the padding mask."""
    from transformers.masking_utils import causal_mask_function, prepare_padding_mask, sdpa_mask

    q_start = int(q_offset)  # a tensor for static caches: read once here (sdpa_mask takes an int)
    allowed = sdpa_mask(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_start, kv_offset=kv_offset,
        mask_function=mask_function or causal_mask_function, attention_mask=attention_mask,
        allow_is_causal_skip=False, use_vmap=kwargs.get("use_vmap", False), device=device,
    )
    padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    if padding is None:
        key_valid = torch.ones(batch_size, kv_length, dtype=torch.bool, device=device)
    else:
        key_valid = padding[:, kv_offset : kv_offset + kv_length].to(device=device, dtype=torch.bool)
    if allowed is None:  # sdpa_mask skips only when allowed to, and it was not
        raise SwapError("transformers' sdpa_mask returned no mask although allow_is_causal_skip=False")
    offset = q_start - kv_offset
    if not 0 <= offset <= kv_length - q_length:
        raise SwapError(f"queries at cache positions {q_start}.. do not lie inside the {kv_length} keys")
    return PagedMask.wrap(allowed.expand(batch_size, 1, q_length, kv_length).contiguous(), key_valid, offset)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class _Paging:
    """One forward's page table, shared by its layer calls: the layout, and on the model's device
    where each real key and query sits in the padded ``[B, H, S|L, D]`` tensors and which flat pool
    slot (``page * page_size + slot``) each key goes to, all in canonical (request-major) order."""

    layout: Layout
    key_batch: torch.Tensor  # [total_kv]
    key_column: torch.Tensor  # [total_kv]
    key_slot: torch.Tensor  # [total_kv]
    query_batch: torch.Tensor  # [total_q]
    query_column: torch.Tensor  # [total_q]
    cases: dict[tuple[Any, ...], Case] = field(default_factory=dict)  # by heads, scale, window, soft cap, dtype

    def pool(self, states: torch.Tensor) -> torch.Tensor:
        """``states`` [B, Hkv, L, D] written into a fresh pool [num_pages, page_size, Hkv, D] whose
        every other slot is NaN."""
        layout = self.layout
        pool = states.new_full((layout.num_pages * layout.page_size, states.shape[1], states.shape[-1]), POISON)
        pool.index_copy_(0, self.key_slot, states[self.key_batch, :, self.key_column])
        return pool.view(layout.num_pages, layout.page_size, *pool.shape[1:])


def _upload_together(host: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """CPU int64 tensors on ``device`` in one copy that does not wait (pinned memory on CUDA)."""
    if device.type == "cpu":
        return host
    flat = upload(torch.cat([t.reshape(-1) for t in host]), device)
    return [part.view(t.shape) for part, t in zip(flat.split([t.numel() for t in host]), host)]


class PagedAttention:
    """The attention function registered with transformers (one per backend, page size and seed).

    With ``prefill``, calls where some sequence has more than one query go to that backend instead
    (a decode-only kernel behind a prefill kernel, as serving engines pair them)."""

    def __init__(self, backend: Backend, *, page_size: int, seed: int, prefill: Backend | None = None) -> None:
        if page_size < 1:
            raise GateInputError(f"page_size must be >= 1, got {page_size}")
        self.backend, self.prefill, self.page_size, self.seed = backend, prefill, page_size, seed
        self.calls = 0  # attention calls served (tests check that the swap really ran)
        self.prefill_calls = 0  # of those, served by ``prefill``
        self.page_tables = 0  # page tables drawn (one per forward and mask); table n uses seed f"{seed}:{n}"
        self.plans = 0  # backend plans made (one per forward while every layer has the same case)
        # Only the latest plan is reused: plans may share a workspace (FlashInfer's), so another plan
        # made in between may overwrite this one's schedule.
        self._last_plan: tuple[Backend, Case, Any] | None = None

    def __call__(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Any,
        *,
        scaling: float | None = None,
        dropout: float = 0.0,
        sliding_window: int | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        if not isinstance(attention_mask, PagedMask):
            raise SwapError(
                f"attention_mask is {type(attention_mask).__name__}, not the PagedMask of this swap: the model did "
                "not build its mask through transformers' mask interface for this attn_implementation"
            )
        if dropout:
            raise SwapError(f"attention dropout {dropout} (put the model in eval mode)")
        if kwargs.get("s_aux") is not None:
            raise SwapError("attention sinks (s_aux) are not wired into the swap")
        if kwargs.get("is_causal", getattr(module, "is_causal", True)) is False:
            raise SwapError(f"{type(module).__name__} is not causal; the swap runs causal decoder attention")
        batch, _, q_len, _ = query.shape
        if key.shape[2] != attention_mask.key_valid.shape[1] or query.shape[0] != key.shape[0]:
            raise SwapError(
                f"keys {tuple(key.shape)} do not match the mask's {tuple(attention_mask.key_valid.shape)} [B, L]"
            )
        window_left = -1 if sliding_window is None else int(sliding_window) - 1  # transformers counts the query
        if window_left not in attention_mask.checked_windows:
            _check_mask(attention_mask, window_left)
            attention_mask.checked_windows.add(window_left)
        paging = attention_mask.pagings.get(id(self))
        if paging is None:
            paging = attention_mask.pagings[id(self)] = self._paging(attention_mask, query.device)
        case = self._case(paging, module, query, key, value, scaling, window_left, kwargs)
        runner = self.backend
        if self.prefill is not None and max(case.layout.qo_lens) > 1:
            runner = self.prefill
        plan = self._plan(runner, case, query.device, type(module).__name__)
        tensors = Tensors(query[paging.query_batch, :, paging.query_column], paging.pool(key), paging.pool(value))
        try:
            result = runner.run(plan, tensors).out
        except Exception as exc:  # noqa: BLE001 - the kernel's own failure, named; the gate fails
            raise KernelFailed(f"backend {runner.name} raised {type(exc).__name__}: {exc}", runner.name) from exc
        expected = (case.layout.total_q, case.heads.num_qo_heads, case.heads.head_dim_vo)
        if tuple(getattr(result, "shape", ())) != expected:
            shape = tuple(result.shape) if hasattr(result, "shape") else type(result).__name__
            raise KernelFailed(f"backend {runner.name} returned out {shape}, expected {expected}", runner.name)
        self.prefill_calls += runner is not self.backend
        out = query.new_zeros(batch, q_len, query.shape[1], value.shape[-1])
        out[paging.query_batch, paging.query_column] = result.to(query.dtype)
        self.calls += 1
        return out, None

    def _paging(self, mask: PagedMask, device: torch.device) -> _Paging:
        """A seeded random page table for ``mask``'s sequences (their real tokens, compacted), with
        a quarter more pages than needed that no request references; the forward's one host sync."""
        key_valid = mask.key_valid.cpu()
        query_valid = key_valid[:, mask.query_key_offset : mask.query_key_offset + mask.shape[2]]
        qo_lens, kv_lens = query_valid.sum(1).tolist(), key_valid.sum(1).tolist()
        rng = random.Random(f"{self.seed}:{self.page_tables}")
        self.page_tables += 1
        needed = sum(-(-n // self.page_size) for n in kv_lens)
        extra = max(1, needed // 4)  # pages no request references: NaN, like every unused slot
        order = list(range(needed + extra))
        rng.shuffle(order)
        layout = Layout.from_lengths(qo_lens, kv_lens, self.page_size, page_order=order, extra_pages=extra)
        # token_slots reads only the layout; the heads are a placeholder (each layer's case has its own)
        key_slot = torch.from_numpy(token_slots(Case(layout, Heads(1, 1, 1, 1))))
        key_batch, key_column = key_valid.nonzero(as_tuple=True)  # row-major: the canonical token order
        query_batch, query_column = query_valid.nonzero(as_tuple=True)
        key_batch, key_column, key_slot, query_batch, query_column = _upload_together(
            [key_batch, key_column, key_slot, query_batch, query_column], device
        )
        return _Paging(layout, key_batch, key_column, key_slot, query_batch, query_column)

    def _case(
        self, paging: _Paging, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        scaling: float | None, window_left: int, kwargs: dict[str, Any],
    ) -> Case:
        config = getattr(module, "config", None)
        soft_cap = kwargs["softcap"] if "softcap" in kwargs else getattr(config, "attn_logit_softcapping", None)
        sm_scale = float(scaling if scaling is not None else getattr(module, "scaling", query.shape[-1] ** -0.5))
        soft_cap, dtype = float(soft_cap or 0.0), _dtype_name(query.dtype)
        heads = (query.shape[1], key.shape[1], query.shape[-1], value.shape[-1])
        signature = (heads, sm_scale, window_left, soft_cap, dtype)
        if signature not in paging.cases:
            paging.cases[signature] = Case(
                paging.layout,
                Heads(*heads),
                Options(causal=True, sm_scale=sm_scale, window_left=window_left, logits_soft_cap=soft_cap,
                        q_dtype=dtype, kv_dtype=dtype),
            )
        return paging.cases[signature]

    def _plan(self, runner: Backend, case: Case, device: torch.device, caller: str) -> Any:
        """``runner.plan(case)``, reused while consecutive calls have the same case (every layer of
        a forward, unless layers differ in window or heads): the plan-once-run-per-layer contract of
        FlashInfer's wrappers."""
        if self._last_plan is not None and self._last_plan[0] is runner and self._last_plan[1] is case:
            return self._last_plan[2]
        if device.type not in runner.capabilities.devices:
            raise SwapError(f"backend {runner.name} runs on {runner.capabilities.devices}, the model on {device}")
        reason = runner.unsupported_reason(case)
        if reason:
            raise SwapError(f"backend {runner.name} cannot run {caller}: {reason}")
        plan = runner.plan(case)
        self._last_plan = (runner, case, plan)
        self.plans += 1
        return plan


def _check_mask(mask: PagedMask, window_left: int) -> None:
    """Raise unless the canonical case's mask (bottom-right causal over each sequence's real tokens,
    compacted; ``window_left``) equals transformers' own mask on every real query row."""
    key_valid, query_valid = mask.key_valid, mask.query_valid
    compact = key_valid.long().cumsum(1) - 1  # index of each real key among its sequence's real keys
    s = query_valid.shape[1]
    query_pos = compact[:, mask.query_key_offset : mask.query_key_offset + s]  # [B, S]
    kv_lens, qo_lens = key_valid.sum(1, keepdim=True), query_valid.sum(1, keepdim=True)
    rank = query_valid.long().cumsum(1) - 1
    if not torch.equal((query_pos == kv_lens - qo_lens + rank) | ~query_valid, torch.ones_like(query_valid)):
        raise SwapError("a sequence has real keys after its first real query that are not queries of this call")
    keep = key_valid[:, None, :] & (compact[:, None, :] <= query_pos[:, :, None])
    if window_left >= 0:
        keep &= compact[:, None, :] >= query_pos[:, :, None] - window_left
    differs = (keep != mask.allowed[:, 0]) & query_valid[:, :, None]
    if differs.any():
        b, i, j = (int(x) for x in differs.nonzero()[0])
        raise SwapError(
            f"the model's attention mask is not the canonical one (bottom-right causal over the real tokens"
            f"{f', window_left={window_left}' if window_left >= 0 else ''}): sequence {b}, query {i}, key {j}: "
            f"transformers {'attends' if mask.allowed[b, 0, i, j] else 'masks'} it"
        )


def default_page_size(backend: Backend, preferred: int = 16) -> int:
    """``preferred``, or the smallest page size the backend declares above it (flash-attn 2's paged
    KV needs a multiple of 256)."""
    caps = backend.capabilities
    if caps.page_sizes is not None:
        return min((p for p in caps.page_sizes if p >= preferred), default=max(caps.page_sizes))
    return -(-preferred // caps.page_size_multiple) * caps.page_size_multiple


def implementation_name(backend: Backend, page_size: int, seed: int, prefill: Backend | None = None) -> str:
    """The name under which the swap registers. transformers treats any name containing "flash" as
    flash-attention (and one with "/" as a hub kernel), so those are spelled differently here."""
    names = backend.name if prefill is None else f"{backend.name}+prefill={prefill.name}"
    label = re.sub(r"[^A-Za-z0-9_.:=+-]", "_", names).replace("flash", "Flash")
    return f"pa-oracle[{label},page={page_size},seed={seed}]"


def register_paged_attention(
    backend: str | Backend | Callable[..., Any],
    *,
    page_size: int | None = None,
    seed: int = 0,
    prefill: str | Backend | Callable[..., Any] | None = None,
) -> str:
    """Register the swap for ``backend``; returns the ``attn_implementation`` name to load a model
    with (``from_pretrained(..., attn_implementation=name)``) or to switch one to
    (``model.set_attn_implementation(name)``). ``page_size`` None: ``default_page_size(backend)``;
    ``seed`` seeds the random page tables (one per forward: the ``n``-th uses ``f"{seed}:{n}"``); ``prefill``
    serves the calls with more than one query per sequence (for a decode-only ``backend``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    resolved = resolve_backend(backend)
    prefill_backend = None if prefill is None else resolve_backend(prefill)
    if page_size is None:
        page_size = max(default_page_size(b) for b in (resolved, prefill_backend) if b is not None)
    name = implementation_name(resolved, page_size, seed, prefill_backend)
    AttentionInterface.register(name, PagedAttention(resolved, page_size=page_size, seed=seed, prefill=prefill_backend))
    AttentionMaskInterface.register(name, _mask_function)
    return name


def registered_swap(name: str) -> PagedAttention:
    """The ``PagedAttention`` registered under ``name`` (to read its call count)."""
    from transformers import AttentionInterface

    fn = AttentionInterface._global_mapping.get(name)
    if not isinstance(fn, PagedAttention):
        raise KeyError(f"{name!r} is not a registered paged-attention swap")
    return fn


def attn_implementation_for(
    spec: str | Backend, *, page_size: int | None = None, seed: int = 0, prefill: str | None = None
) -> str:
    """``"hf:sdpa"`` -> transformers' stock ``"sdpa"``; anything else -> the swap for that backend."""
    if isinstance(spec, str) and spec.startswith(STOCK_PREFIX):
        if prefill is not None:
            raise SwapError(f"{spec} is transformers' own attention; it takes no prefill backend")
        return spec.removeprefix(STOCK_PREFIX)
    return register_paged_attention(spec, page_size=page_size, seed=seed, prefill=prefill)
