"""flash-attention 2: ``flash_attn_varlen_func(..., block_table=)`` and ``flash_attn_with_kvcache``
(paged with ``block_table`` + ``cache_seqlens``, contiguous, and with forced split-KV).

Conventions converted here: ``window_size=(left, right)`` with bottom-right alignment, so
FlashInfer's ``window_left = w`` is ``(w, 0)`` causal or ``(w, -1)`` not; ALiBi is flash-attn's
``-slope * |i + seqlen_k - seqlen_q - j|`` (the oracle's), except that the causal kernel adds
``slope * j`` to every row instead (``alibi.h``/``mask.h``: "Simpler, we add the same bias vector to
all rows"; tridao in flash-attention#1585): the output is the same (softmax is shift invariant) and
the LSE is larger by ``slope * p``, ``p`` the query's position, which is undone here. The causal
kernel runs when ``causal`` and no window is left after ``flash_api.cpp`` drops a
``window_left >= seqlen_k``; a window keeps the non-causal (``|...|``) branch. ``softcap`` caps the
scaled logit, then ALiBi is added (the oracle's default order: ``apply_softcap`` precedes
``apply_mask``).
flash-attn reports LSE ``+inf`` for a row with no key (consumers such as vLLM's merge map it to
``-inf``); it is mapped to ``-inf`` here, so a finite sentinel or a NaN still fails. Paged KV needs
``page_size % 256 == 0`` (flash-attn 2's ``TORCH_CHECK``); ``with_kvcache`` takes one ``seqlen_q``
for the whole batch.

Memory layouts (``Storage``): ``flash-attn-kvcache-paged`` and ``flash-attn-varlen`` declare every one
(``mha_varlen_fwd`` with a block table checks the same ``stride(-1) == 1`` and takes
``k_batch_stride = k.stride(0)`` and the row and head strides from the tensors, as below). ``flash_attn_with_kvcache``
asserts only ``k_cache.stride(-1) == 1`` (and q's, through ``maybe_contiguous``); ``mha_fwd_kvcache``
(flash_api.cpp) checks the shapes and takes the page, row and head strides from the tensors
(``k_batch_stride`` = ``kcache.stride(0)`` per block of the block table, ``k_row_stride``,
``k_head_stride``). So the caches are handed as the NHD-indexed views they are (the K and V halves of a
combined tensor, HND memory as a strided NHD view, a pool offset) and q as the strided view of its
fused QKV buffer, reshaped to ``[B, seqlen_q, H, D]`` without a copy.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pa_oracle.backends.base import (
    Backend,
    Capabilities,
    Contract,
    GraphCall,
    KernelOutput,
    RawOutput,
    Unsupported,
    capture_cuda_graph,
    raw_lse,
    register,
)
from pa_oracle.oracle.case import STORAGE_FEATURES, Case
from pa_oracle.oracle.tensors import Tensors, token_addresses

_FLASH_ATTN = Capabilities(
    devices=("cuda",),
    q_dtypes=("float16", "bfloat16"),
    head_dims=(32, 40, 64, 80, 96, 128, 160, 192, 256),
    head_dim_vo_may_differ=False,
    sinks=False,
    fp8_scales=False,
)


_FLASH_ATTN_CONTRACT = Contract(
    empty_row_lse="+inf",
    alibi_lse_shift="the causal kernel adds slope * j to every row: LSE larger by slope * p, p the query's position",
)


def _window(case: Case) -> tuple[int, int]:
    return (case.options.window_left, 0 if case.options.causal else -1)


def _alibi(case: Case, device: torch.device) -> torch.Tensor | None:
    slopes = case.options.alibi_slopes
    return None if slopes is None else torch.tensor(slopes, dtype=torch.float32, device=device)


def _lse_to_natural_minus_inf(lse: torch.Tensor) -> torch.Tensor:
    """flash-attn's LSE of an empty row is +inf; the oracle's is -inf."""
    return torch.where(lse == float("inf"), float("-inf"), lse.float())


def causal_alibi_kernel(case: Case, seqlen_k: int) -> bool:
    """True if flash-attn runs ``case`` with ALiBi in its causal kernel (``Is_causal``), whose bias is
    ``slope * j`` on every row: ``flash_api.cpp`` drops a ``window_left >= seqlen_k`` (the host's
    ``seqlen_k``: the cache's length, or ``max_seqlen_k``), and ``is_causal`` stays on for
    ``seqlen_q == 1`` when there are ALiBi slopes."""
    opts = case.options
    return opts.alibi_slopes is not None and opts.causal and (opts.window_left < 0 or opts.window_left >= seqlen_k)


def undo_causal_alibi_shift(case: Case, lse: torch.Tensor) -> torch.Tensor:
    """The oracle's LSE [total_q, Hq] from the causal kernel's, which is larger by ``slope * p`` (``p``
    the query's absolute position); rows with no key stay infinite."""
    lay, slopes = case.layout, case.options.alibi_slopes
    assert slopes is not None
    position = [k - q + i for q, k in zip(lay.qo_lens, lay.kv_lens) for i in range(q)]
    shift = torch.tensor(position, dtype=torch.float32, device=lse.device)[:, None] * torch.tensor(slopes, device=lse.device)
    return torch.where(torch.isinf(lse), lse, lse - shift)


class _FlashAttn(Backend):
    package = "flash_attn"
    extra = "flash-attn"
    contract = _FLASH_ATTN_CONTRACT

    def kernel_seqlen_k(self, case: Case) -> int:
        """The ``seqlen_k`` flash_api.cpp compares ``window_left`` with."""
        return max(case.layout.kv_lens)

    def alibi_lse_shifted(self, case: Case) -> bool:
        return causal_alibi_kernel(case, self.kernel_seqlen_k(case))

    def _natural_lse(self, case: Case, lse: torch.Tensor) -> torch.Tensor:
        """[total_q, Hq] kernel LSE -> the oracle's: +inf -> -inf, the causal ALiBi shift undone."""
        lse = _lse_to_natural_minus_inf(lse)
        return undo_causal_alibi_shift(case, lse) if self.alibi_lse_shifted(case) else lse
    compile_fields = ()  # the wheel ships every kernel compiled (AOT): nothing compiles per case


@register
class FlashAttnVarlenPaged(_FlashAttn):
    name = "flash-attn-varlen"
    description = "flash_attn_varlen_func with a paged block_table"
    family = "flash-attn2-varlen"
    capabilities = _FLASH_ATTN.replace(page_size_multiple=256, storages=STORAGE_FEATURES)

    def call_source(self, case: Case) -> str | None:
        return """\
from flash_attn import flash_attn_varlen_func

cu_k = [0]
for n in kv_lens:
    cu_k.append(cu_k[-1] + n)
out, lse, _ = flash_attn_varlen_func(
    q, k_cache, v_cache, index(qo_indptr), index(cu_k), max(qo_lens), max(kv_lens),
    softmax_scale=sm_scale, causal=causal, window_size=(window_left, 0 if causal else -1), softcap=logits_soft_cap,
    alibi_slopes=None if alibi_slopes is None else torch.tensor(alibi_slopes, dtype=torch.float32, device=device),
    return_attn_probs=True, block_table=index(block_table),
)
lse = torch.where(lse == math.inf, -math.inf, lse.float()).transpose(0, 1)  # [H, total_q]; +inf: a row with no key
"""

    def run(self, plan: Case, tensors: Tensors) -> KernelOutput:
        from flash_attn import flash_attn_varlen_func

        case, device = plan, tensors.q.device
        lay = case.layout
        index = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
        cu_k = [0]
        for n in lay.kv_lens:
            cu_k.append(cu_k[-1] + n)
        out, lse, _ = flash_attn_varlen_func(
            tensors.q, tensors.k_cache, tensors.v_cache, index(lay.qo_indptr), index(cu_k),
            max(lay.qo_lens), max(lay.kv_lens), softmax_scale=case.sm_scale, causal=case.options.causal,
            window_size=_window(case), softcap=case.options.logits_soft_cap, alibi_slopes=_alibi(case, device),
            return_attn_probs=True, block_table=index(lay.block_table(pad=0)),
        )
        return KernelOutput(out, self._natural_lse(case, lse.transpose(0, 1)))


class _KvCache(_FlashAttn):
    """``flash_attn_with_kvcache``: queries as a dense [B, seqlen_q] batch. The plan holds every
    index tensor on the device, so that ``run`` makes no host copies (it can be graph-captured)."""

    paged: ClassVar[bool]
    num_splits: ClassVar[int] = 0
    cuda_graphs = True
    family = "flash-attn2-kvcache"

    def kernel_seqlen_k(self, case: Case) -> int:
        lay = case.layout
        if self.paged:  # max_num_blocks_per_seq * page_block_size
            return max(lay.num_pages_per_request, default=0) * lay.page_size
        return max(max(lay.kv_lens), 1)  # the contiguous cache's length (``_contiguous``)

    def plan(self, case: Case) -> dict[str, Any]:
        lay, device = case.layout, self.device or "cuda"
        index = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
        plan: dict[str, Any] = {
            "case": case,
            "cache_seqlens": index(lay.kv_lens),
            "block_table": index(lay.block_table(pad=0)) if self.paged else None,
            "alibi_slopes": _alibi(case, torch.device(device)),
        }
        if not self.paged:  # where each token goes in the contiguous [B, max_kv] cache
            pages, slots = token_addresses(case)
            request = torch.repeat_interleave(torch.arange(lay.batch_size), torch.tensor(lay.kv_lens))
            position = torch.cat([torch.arange(n) for n in lay.kv_lens])
            plan["gather"] = tuple(t.to(device) for t in (pages, slots, request, position))
        return plan

    def _contiguous(self, plan: dict[str, Any], cache: torch.Tensor) -> torch.Tensor:
        """[B, max_kv, Hkv, D]: each request's tokens gathered from its pages (zero padding)."""
        lay = plan["case"].layout
        pages, slots, request, position = plan["gather"]
        dense = cache.new_zeros(lay.batch_size, max(max(lay.kv_lens), 1), *cache.shape[2:])
        dense[request, position] = cache[pages, slots]
        return dense

    def _caches(self, plan: dict[str, Any], tensors: Tensors) -> tuple[torch.Tensor, torch.Tensor]:
        if self.paged:
            return tensors.k_cache, tensors.v_cache
        return self._contiguous(plan, tensors.k_cache), self._contiguous(plan, tensors.v_cache)

    def _call(self, plan: dict[str, Any], q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> RawOutput:
        """The kernel's own (out [B, sq, H, D], lse [B, H, sq])."""
        from flash_attn import flash_attn_with_kvcache

        case: Case = plan["case"]
        lay = case.layout
        return flash_attn_with_kvcache(
            q.view(lay.batch_size, lay.qo_lens[0], *q.shape[1:]), k_cache, v_cache,
            cache_seqlens=plan["cache_seqlens"], block_table=plan["block_table"],
            softmax_scale=case.sm_scale, causal=case.options.causal, window_size=_window(case),
            softcap=case.options.logits_soft_cap, alibi_slopes=plan["alibi_slopes"],
            num_splits=self.num_splits, return_softmax_lse=True,
        )

    def call_source(self, case: Case) -> str | None:
        if self.paged:
            caches, table = "k_cache, v_cache", "index(block_table)"
        else:
            caches, table = "contiguous(k_cache), contiguous(v_cache)", "None"
        gather = "" if self.paged else """\
def contiguous(cache):  # [B, max_kv, Hkv, D]: each request's tokens gathered from its pages (zero padding)
    dense = cache.new_zeros(B, max(max(kv_lens), 1), *cache.shape[2:])
    request = torch.repeat_interleave(torch.arange(B), torch.tensor(kv_lens)).to(device)
    position = torch.cat([torch.arange(n) for n in kv_lens]).to(device)
    dense[request, position] = cache.flatten(0, 1)[torch.tensor(token_slots, device=device)]
    return dense


"""
        return gather + f"""\
from flash_attn import flash_attn_with_kvcache

out, lse = flash_attn_with_kvcache(
    q.view(B, qo_lens[0], num_qo_heads, head_dim_qk), {caches},
    cache_seqlens=index(kv_lens), block_table={table},
    softmax_scale=sm_scale, causal=causal, window_size=(window_left, 0 if causal else -1),
    softcap=logits_soft_cap,
    alibi_slopes=None if alibi_slopes is None else torch.tensor(alibi_slopes, dtype=torch.float32, device=device),
    num_splits={self.num_splits}, return_softmax_lse=True,
)
out, lse = out.flatten(0, 1), lse.transpose(1, 2).flatten(0, 1)  # [B, sq, H, D], [B, H, sq] -> rows
lse = torch.where(lse == math.inf, -math.inf, lse.float())  # +inf: a row with no key
"""

    @staticmethod
    def _rows(raw: RawOutput) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = raw[0], raw_lse(raw)
        return out.flatten(0, 1), lse.transpose(1, 2).flatten(0, 1)  # [B, H, sq] -> [B * sq, H]

    def _finish(self, case: Case, raw: RawOutput) -> KernelOutput:
        out, lse = self._rows(raw)
        return KernelOutput(out.clone(), self._natural_lse(case, lse))

    def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
        return self._finish(plan["case"], self._call(plan, tensors.q, *self._caches(plan, tensors)))

    def capture_graph(self, case: Case, tensors: Tensors) -> GraphCall:
        plan = self.plan(case)
        q = tensors.q.clone()
        k, v = (x.clone() for x in self._caches(plan, tensors))

        def load(new: Tensors) -> None:
            q.copy_(new.q)
            for target, source in zip((k, v), self._caches(plan, new)):
                target.copy_(source)

        launch = lambda: self._call(plan, q, k, v)
        replay, outputs = capture_cuda_graph(launch)
        return GraphCall(load=load, launch=launch, replay=replay, outputs=outputs, rows=self._rows,
                         finish=lambda raw: self._finish(case, raw))


_KVCACHE = _FLASH_ATTN.replace(uniform_qo_len=True)


@register
class FlashAttnKvCachePaged(_KvCache):
    name = "flash-attn-kvcache-paged"
    description = "flash_attn_with_kvcache with block_table + cache_seqlens"
    capabilities = _KVCACHE.replace(page_size_multiple=256, storages=STORAGE_FEATURES)
    paged = True

    def write_layout(self, plan: dict[str, Any], case: Case) -> None:
        """Overwrite ``cache_seqlens`` and ``block_table`` in place: the kernel reads both at run time."""
        for name, values in (("cache_seqlens", case.layout.kv_lens), ("block_table", case.layout.block_table(pad=0))):
            new = torch.tensor(values, dtype=torch.int32, device=plan[name].device)
            if new.shape != plan[name].shape:
                raise Unsupported(f"{name} of layout B is {tuple(new.shape)}, the plan's is {tuple(plan[name].shape)}")
            plan[name].copy_(new)


@register
class FlashAttnKvCache(_KvCache):
    name = "flash-attn-kvcache"
    description = "flash_attn_with_kvcache on a contiguous cache gathered from the pages"
    capabilities = _KVCACHE
    paged = False


@register
class FlashAttnKvCacheSplit(_KvCache):
    name = "flash-attn-kvcache-split4"
    description = "flash_attn_with_kvcache, contiguous cache, num_splits=4 (split-KV + combine)"
    capabilities = _KVCACHE
    paged = False
    num_splits = 4
