"""vLLM V1's FlashInfer attention as one engine composite (``vllm-flashinfer``): the batch is
reordered decode -> extend -> prefill, the decode chunk runs on ``BatchDecodeWithPagedKVCacheWrapper``
(tensor cores), the rest on ``BatchPrefillWithPagedKVCacheWrapper`` with ``qo_indptr`` re-based
to the chunk, and the outputs are stitched back to the original request order.

Followed from vllm-project/vllm (``vllm/v1/attention/backends/utils.py`` @00bd1493b3e8,
``vllm/v1/attention/backends/flashinfer.py`` @00a817ada816):

* ``reorder_batch_to_split_decodes_and_prefills``: regions decode (``num_scheduled_tokens <=
  decode_threshold`` and ``num_computed_tokens > 0``), extend (more tokens, some computed),
  prefill (``num_computed_tokens == 0``); misplaced requests are swapped into the misplaced
  slots in ``argsort(regions, kind="stable")`` order by following swap cycles.
* ``FlashInferMetadataBuilder``: ``reorder_batch_threshold = 1`` (``_init_reorder_batch_threshold(1,
  supports_spec_as_decode=can_use_trtllm)``; no trtllm-gen and no speculative decoding on
  Hopper), then ``split_decodes_and_prefills(..., decode_threshold=1, require_uniform=True)``.
* ``build``: ``qo_indptr_cpu[prefill_start:] - qo_indptr_cpu[prefill_start]`` for the prefill
  plan, but ``paged_kv_indptr_cpu[prefill_start:]`` *not* re-based, with the whole
  ``paged_kv_indices``; the decode plan takes ``paged_kv_indptr_cpu[:num_decodes + 1]``. Both
  plans run on host index tensors with ``causal=True`` (prefill), ``pos_encoding_mode="NONE"``
  (decode), ``sm_scale``, ``window_left``, ``logits_soft_cap``, ``q_data_type`` (the model
  dtype), ``kv_data_type``, ``fixed_split_size=-1``, ``disable_split_kv=False``.
* ``_get_decode_wrapper``: ``use_tensor_cores=True`` ("at least as good as cuda cores for all
  attention ops in latest gpus"); vLLM <= 0.10 used ``VLLM_FLASHINFER_FORCE_TENSOR_CORES or
  num_qo_heads // num_kv_heads > 4`` instead (commit 5314c90d9f16).
* ``FlashInferImpl.forward``: one ``[num_blocks, 2, block_size, Hkv, D]`` cache tensor (NHD),
  ``prefill_wrapper.run(query[num_decode_tokens:], kv_cache, k_scale=, v_scale=,
  out=output[num_decode_tokens:])`` then the decode wrapper on ``query[:num_decode_tokens]``.

Engine invariants declared as capabilities: every request has 1 <= qo_len <= kv_len, causal
only, no ALiBi (vLLM's FlashInfer backend ignores its slopes), no sinks (trtllm-gen only),
vLLM's FlashInfer kernel block sizes 16/32/64. The one deviation: ``return_lse=True`` is added
to both runs so the stitched LSE is judged too (same kernels, FlashInfer writes it either way).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pa_oracle.backends.base import CompileKey, KernelOutput, Precondition, register
from pa_oracle.backends.flashinfer import (
    _FLASHINFER,
    _FLASHINFER_CONTRACT,
    LN_2,
    _FlashInferBackend,
    _workspace,
    auto_prefill_backend,
    module_uri,
)
from pa_oracle.oracle.case import Case, Layout
from pa_oracle.oracle.tensors import Tensors

DECODE_THRESHOLD = 1  # FlashInferMetadataBuilder.reorder_batch_threshold without spec decoding
DECODE_USE_TENSOR_CORES = True  # vLLM's _get_decode_wrapper since 0.11
DECODE, EXTEND, PREFILL = 0, 1, 2  # vLLM's req_regions


def request_regions(qo_lens: Sequence[int], kv_lens: Sequence[int], decode_threshold: int = DECODE_THRESHOLD) -> list[int]:
    """vLLM's region of each request: a request's computed tokens are the keys before its queries."""
    regions = []
    for qo_len, kv_len in zip(qo_lens, kv_lens, strict=True):
        if kv_len - qo_len == 0:
            regions.append(PREFILL)
        else:
            regions.append(DECODE if qo_len <= decode_threshold else EXTEND)
    return regions


def reorder_requests(qo_lens: Sequence[int], kv_lens: Sequence[int], decode_threshold: int = DECODE_THRESHOLD) -> tuple[int, ...]:
    """``order[position] = original request`` after ``reorder_batch_to_split_decodes_and_prefills``.

    A port of vLLM's swap-cycle loop (``input_batch.swap_states(src, dst)``), not a sort: requests
    already in their target region stay where they are.
    """
    regions = request_regions(qo_lens, kv_lens, decode_threshold)
    num_decodes, num_extends = regions.count(DECODE), regions.count(EXTEND)
    targets = [DECODE] * num_decodes + [EXTEND] * num_extends + [PREFILL] * (len(regions) - num_decodes - num_extends)
    misplaced = [i for i, (region, target) in enumerate(zip(regions, targets)) if region != target]
    sources = sorted(misplaced, key=lambda i: regions[i])  # np.argsort(kind="stable")
    src_dest = dict(zip(sources, misplaced))
    slots = list(range(len(regions)))  # slots[position] = the request held there now
    for src in src_dest:
        dst = src_dest[src]
        while src != dst:
            slots[src], slots[dst] = slots[dst], slots[src]
            next_dst = src_dest.get(dst, dst)
            src_dest[dst] = dst
            dst = next_dst
    return tuple(slots)


def split_decodes_and_prefills(
    qo_lens: Sequence[int], decode_threshold: int = DECODE_THRESHOLD, require_uniform: bool = True
) -> tuple[int, int, int, int]:
    """vLLM's ``split_decodes_and_prefills`` on a reordered batch:
    ``(num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens)``."""
    num_reqs, num_tokens = len(qo_lens), sum(qo_lens)
    if max(qo_lens) <= decode_threshold and (not require_uniform or decode_threshold <= 1):
        return num_reqs, 0, num_tokens, 0
    if qo_lens[0] > decode_threshold:
        return 0, num_reqs, 0, num_tokens
    if require_uniform:
        if all(q in (qo_lens[0], 0) for q in qo_lens):
            return num_reqs, 0, num_tokens, 0
        is_prefill = [q != qo_lens[0] for q in qo_lens]
    else:
        is_prefill = [q > decode_threshold for q in qo_lens]
    if not any(is_prefill):
        return num_reqs, 0, num_tokens, 0
    first_prefill = is_prefill.index(True)
    num_decode_tokens = sum(qo_lens[:first_prefill])
    return first_prefill, num_reqs - first_prefill, num_decode_tokens, num_tokens - num_decode_tokens


@dataclass(frozen=True)
class Chunk:
    """One wrapper's share of the reordered batch, indexed as vLLM plans it."""

    rows: range  # its query rows in the reordered batch
    qo_indptr: tuple[int, ...]  # re-based: starts at 0
    kv_indptr: tuple[int, ...]  # a slice of the reordered kv_indptr, not re-based (into the whole kv_indices)
    kv_last_page_len: tuple[int, ...]


@dataclass(frozen=True)
class BatchSplit:
    order: tuple[int, ...]  # reordered position -> original request
    row_order: tuple[int, ...]  # reordered query row -> original query row
    kv_indices: tuple[int, ...]  # the reordered requests' pages, concatenated
    decode: Chunk | None
    prefill: Chunk | None


def _cumsum(values: Sequence[int]) -> tuple[int, ...]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return tuple(out)


def split_batch(layout: Layout, decode_threshold: int = DECODE_THRESHOLD) -> BatchSplit:
    """Reorder ``layout`` as vLLM does and cut it into the decode and prefill chunks."""
    qo_lens, kv_lens = layout.qo_lens, layout.kv_lens
    for b, (q, k) in enumerate(zip(qo_lens, kv_lens)):
        if not 1 <= q <= k:
            raise ValueError(f"request {b}: vLLM schedules 1 <= qo_len <= kv_len, got qo_len={q}, kv_len={k}")
    order = reorder_requests(qo_lens, kv_lens, decode_threshold)
    qo = [qo_lens[b] for b in order]
    qo_indptr = _cumsum(qo)
    kv_indptr = _cumsum([layout.num_pages_per_request[b] for b in order])
    last = tuple(layout.kv_last_page_len[b] for b in order)
    row_order = tuple(row for b in order for row in range(layout.qo_indptr[b], layout.qo_indptr[b + 1]))
    num_decodes, num_prefills, num_decode_tokens, _ = split_decodes_and_prefills(qo, decode_threshold)
    if any(q != 1 for q in qo[:num_decodes]):
        raise ValueError(f"the decode wrapper takes one query per request; decode qo_lens {qo[:num_decodes]}")
    decode = prefill = None
    if num_decodes:
        decode = Chunk(
            range(0, num_decode_tokens), qo_indptr[: num_decodes + 1], kv_indptr[: num_decodes + 1], last[:num_decodes]
        )
    if num_prefills:
        start = qo_indptr[num_decodes]
        prefill = Chunk(
            range(num_decode_tokens, qo_indptr[-1]), tuple(x - start for x in qo_indptr[num_decodes:]),
            kv_indptr[num_decodes:], last[num_decodes:],
        )
    kv_indices = tuple(page for b in order for page in layout.pages_of(b))
    return BatchSplit(order, row_order, kv_indices, decode, prefill)


def stitch_rows(reordered: torch.Tensor, row_order: torch.Tensor) -> torch.Tensor:
    """Rows of the reordered batch back in the original order: ``out[row_order[i]] = reordered[i]``."""
    out = torch.empty_like(reordered)
    out[row_order] = reordered
    return out


@register
class VllmFlashInfer(_FlashInferBackend):
    name = "vllm-flashinfer"
    description = "vLLM V1 FlashInfer backend: decodes first (tensor-core decode wrapper), paged prefill on the rest, stitched"
    capabilities = _FLASHINFER.replace(
        page_sizes=(16, 32, 64), min_qo_len=1, qo_len_above_kv_len=False, empty_requests=False,
        causal=(True,), alibi=False,
    )
    contract = dataclasses.replace(_FLASHINFER_CONTRACT, preconditions=(
        Precondition("min_qo_len", "vLLM schedules at least one query per request"),
        Precondition("qo_len_above_kv_len", "vLLM's requests hold their own queries' keys (qo_len <= kv_len)"),
        Precondition("empty_requests", "vLLM schedules no request without keys or queries"),
    ))

    compile_seconds = 120.0  # two prefill modules (fa3 on sm90: more)

    def modules(self, key: CompileKey) -> list[str]:
        """The prefill wrapper's module (backend "auto") and the decode wrapper's: a batch of decodes and
        prefills loads both, so a key counts as built only when both are."""
        decode = module_uri("prefill", key, "fa2") if DECODE_USE_TENSOR_CORES else module_uri("decode", key)
        return list(dict.fromkeys((module_uri("prefill", key, auto_prefill_backend(key)), decode)))

    def plan(self, case: Case) -> dict[str, Any]:
        import flashinfer

        lay, heads, opts, device = case.layout, case.heads, case.options, self.device or "cuda"
        split = split_batch(lay)
        host = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731 - vLLM plans from pinned host buffers
        kv_indices = torch.tensor(split.kv_indices, dtype=torch.int32, device=device)
        shape = (heads.num_qo_heads, heads.num_kv_heads, heads.head_dim_qk, lay.page_size)
        common = {
            "sm_scale": case.sm_scale, "window_left": opts.window_left, "logits_soft_cap": opts.logits_soft_cap or None,
            "q_data_type": getattr(torch, opts.q_dtype), "kv_data_type": getattr(torch, opts.kv_dtype),
            "fixed_split_size": -1, "disable_split_kv": False,
        }
        prefill_wrapper = decode_wrapper = None
        if split.prefill is not None:
            chunk = split.prefill
            prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(_workspace(device), "NHD")
            prefill_wrapper.plan(
                host(chunk.qo_indptr), host(chunk.kv_indptr), kv_indices, host(chunk.kv_last_page_len), *shape,
                causal=True, **common,
            )
        if split.decode is not None:
            chunk = split.decode
            decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                _workspace(device), "NHD", use_tensor_cores=DECODE_USE_TENSOR_CORES
            )
            decode_wrapper.plan(
                host(chunk.kv_indptr), kv_indices, host(chunk.kv_last_page_len), *shape, pos_encoding_mode="NONE", **common
            )
        row_order = torch.tensor(split.row_order, dtype=torch.long, device=device)
        return {"case": case, "split": split, "row_order": row_order, "prefill": prefill_wrapper, "decode": decode_wrapper}

    def run(self, plan: dict[str, Any], tensors: Tensors) -> KernelOutput:
        case: Case = plan["case"]
        split: BatchSplit = plan["split"]
        opts = case.options
        query = tensors.q[plan["row_order"]]  # the engine's batch is already in this order
        kv_cache = torch.stack((tensors.k_cache, tensors.v_cache), dim=1)
        # NaN, so a row neither wrapper writes shows up
        output = torch.full((*query.shape[:2], case.heads.head_dim_vo), math.nan, dtype=query.dtype, device=query.device)
        lse = torch.full(query.shape[:2], math.nan, dtype=torch.float32, device=query.device)
        for part in ("prefill", "decode"):  # FlashInferImpl.forward runs the prefill wrapper first
            chunk: Chunk | None = getattr(split, part)
            if chunk is None:
                continue
            rows = slice(chunk.rows.start, chunk.rows.stop)
            _, chunk_lse = plan[part].run(
                query[rows], kv_cache, k_scale=opts.k_scale, v_scale=opts.v_scale, out=output[rows], return_lse=True
            )
            lse[rows] = chunk_lse.float()
        return KernelOutput(stitch_rows(output, plan["row_order"]), stitch_rows(lse, plan["row_order"]) * LN_2)
