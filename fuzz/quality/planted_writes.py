"""Write kernels with planted bugs (each must be caught) and correct ones written differently
(which must pass), for the KV-cache write check (``pa_oracle.fuzz.checks.append``). Not registered:
tests and ``pa-oracle writes --kernel pa_oracle.fuzz.quality.planted_writes:CLASS`` name them.

``BUGS`` are caught by the draws every write kernel gets; ``UPSTREAM_BUGS`` are bug classes of real
write paths (vLLM, SGLang, FlashInfer issues 2024-26) caught the same way; ``NEW_DRAW_BUGS`` are caught only by
a newer draw (padding rows, fp8 scales), so each proves that its draw is judged."""

from __future__ import annotations

import torch

from pa_oracle.backends.writes import WriteCapabilities
from pa_oracle.oracle.append import CACHE_DTYPES

from pa_oracle.backends.writes import WriteKernel
from pa_oracle.oracle.append import AppendCase, AppendInputs


def _scatter(case: AppendCase, pool: torch.Tensor, values: torch.Tensor, pages: torch.Tensor, slots: torch.Tensor) -> None:
    view = pool if case.kv_layout == "NHD" else pool.permute(0, 2, 1, 3)
    view.index_put_((pages, slots), values)


class PerTokenLoop(WriteKernel):
    """Correct, written differently: walks the page table token by token from the lengths."""

    name = "planted:per-token-loop"

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        token = 0
        for b, (start, count) in enumerate(zip(case.seq_lens_before, case.append_lens)):
            first = int(inputs.kv_indptr[b])
            for position in range(start, start + count):
                page = int(inputs.kv_indices[first + position // case.page_size])
                for pool, values in ((inputs.k_pool, inputs.append_k), (inputs.v_pool, inputs.append_v)):
                    if case.kv_layout == "NHD":
                        pool[page, position % case.page_size] = values[token]
                    else:
                        pool[page, :, position % case.page_size] = values[token]
                token += 1


class OneSlotPast(WriteKernel):
    """Off by one: every token lands one slot later (the last slot of a page spills into the next page id)."""

    name = "planted:one-slot-past"

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        flat = (inputs.slot_mapping + 1) % (case.num_pages * case.page_size)
        for pool, values in ((inputs.k_pool, inputs.append_k), (inputs.v_pool, inputs.append_v)):
            _scatter(case, pool, values, flat // case.page_size, flat % case.page_size)


class IgnoresLastPageLen(WriteKernel):
    """Ignores the last page length: starts each request's append at the start of its last page."""

    name = "planted:ignores-last-page-len"

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        request = inputs.batch_indices.long()
        device = request.device
        starts = torch.tensor((0, *case.append_lens), device=device).cumsum(0)[:-1]
        within = torch.arange(case.total_appended, device=device) - starts[request]
        pages_after = torch.diff(inputs.kv_indptr).long()[request]
        position = ((pages_after - 1) * case.page_size + within).clamp(max=pages_after * case.page_size - 1)
        pages = inputs.kv_indices.long()[inputs.kv_indptr.long()[request] + position // case.page_size]
        for pool, values in ((inputs.k_pool, inputs.append_k), (inputs.v_pool, inputs.append_v)):
            _scatter(case, pool, values, pages, position % case.page_size)


class LayoutConfusion(WriteKernel):
    """Writes an HND pool as if it were NHD (the slot and head axes swapped)."""

    name = "planted:hnd-as-nhd"

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        pages, slots = inputs.slot_mapping // case.page_size, inputs.slot_mapping % case.page_size
        for pool, values in ((inputs.k_pool, inputs.append_k), (inputs.v_pool, inputs.append_v)):
            if case.kv_layout == "HND":
                flat = pool.reshape(-1)  # copies a non-contiguous view: then the write is lost, which is caught too
                nhd = flat.view(case.num_pages, case.page_size, case.num_kv_heads, case.head_dim)
                nhd.index_put_((pages, slots), values)
                if flat.data_ptr() != pool.data_ptr():
                    pool.copy_(flat.view_as(pool))
            else:
                pool.index_put_((pages, slots), values)


class AssumesContiguous(WriteKernel):
    """Computes addresses from the pool's shape as if it were contiguous (a stride bug): wrong for
    the K and V halves of one ``[pages, 2, ...]`` tensor."""

    name = "planted:assumes-contiguous"

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        pages, slots = inputs.slot_mapping // case.page_size, inputs.slot_mapping % case.page_size
        for pool, values in ((inputs.k_pool, inputs.append_k), (inputs.v_pool, inputs.append_v)):
            dense = torch.empty(pool.shape).stride()
            view = torch.as_strided(pool, pool.shape, dense, pool.storage_offset())
            _scatter(case, view, values, pages, slots)


def _each_token(case: AppendCase) -> list[tuple[int, int, int]]:
    """(token row, request, position) of every real appended token, in order."""
    rows, row = [], 0
    for b, (start, count) in enumerate(zip(case.seq_lens_before, case.append_lens)):
        rows += [(row + i, b, start + i) for i in range(count)]
        row += count
    return rows


def _put(case: AppendCase, inputs: AppendInputs, page: int, slot: int, token: int) -> None:
    """Store appended row ``token`` at (``page``, ``slot``) of both pools, quantised as a correct write does."""
    for pool, values, scale in ((inputs.k_pool, inputs.append_k, case.k_scale), (inputs.v_pool, inputs.append_v, case.v_scale)):
        value = values[token]
        value = (value.double() / scale).to(pool.dtype) if case.quantised else value
        if case.kv_layout == "NHD":
            pool[page, slot] = value
        else:
            pool[page, :, slot] = value


class NewSlotsContiguous(WriteKernel):
    """New slots assumed contiguous: finds the first appended token's slot, then writes the rest of the
    request's append at the following slot numbers, as if its pages followed each other in the pool."""

    name = "planted:new-slots-contiguous"

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        first: dict[int, tuple[int, int]] = {}
        for token, b, position in _each_token(case):
            start, offset = first.setdefault(b, (int(inputs.slot_mapping[token]), position))
            slot = (start + position - offset) % (case.num_pages * case.page_size)
            _put(case, inputs, slot // case.page_size, slot % case.page_size, token)


class NextSlotLenModPage(WriteKernel):
    """Next free slot = len % page, in the page that holds the last token: when a request's last page is
    full (len a multiple of the page size) its first new token overwrites slot 0 of that full page."""

    name = "planted:next-slot-len-mod-page"

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        for token, b, position in _each_token(case):
            before = case.seq_lens_before[b]
            current = max(-(-before // case.page_size) - 1, 0)  # the page of the last token
            at = current * case.page_size + before % case.page_size + position - before
            page = int(inputs.kv_indices[int(inputs.kv_indptr[b]) + at // case.page_size])
            _put(case, inputs, page, at % case.page_size, token)


class CompactedRequestIndex(WriteKernel):
    """Compacted request index on uncompacted arrays: numbers only the requests that append something,
    and reads the page table (``kv_indptr``) by that number: wrong after a request that appends nothing."""

    name = "planted:compacted-request-index"

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        appending = [b for b, count in enumerate(case.append_lens) if count]
        for token, b, position in _each_token(case):
            compact = appending.index(b)
            page = int(inputs.kv_indices[int(inputs.kv_indptr[compact]) + position // case.page_size])
            _put(case, inputs, page, position % case.page_size, token)


class StoresNextPow2Heads(WriteKernel):
    """Stores a block of next_pow2(heads) heads per slot without a mask (a Triton ``tl.arange`` over the
    padded head count): with 3 heads the 4th, zeros, lands on whatever follows the slot's last head."""

    name = "planted:store-next-pow2-heads"

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        heads = case.num_kv_heads
        block = 1 << (heads - 1).bit_length()
        for token, _b, _position in _each_token(case):
            slot = int(inputs.slot_mapping[token])
            page, within = slot // case.page_size, slot % case.page_size
            for pool, values in ((inputs.k_pool, inputs.append_k), (inputs.v_pool, inputs.append_v)):
                head_stride = pool.stride(2 if case.kv_layout == "NHD" else 1)
                slot_stride = pool.stride(1 if case.kv_layout == "NHD" else 2)
                offset = pool.storage_offset() + page * pool.stride(0) + within * slot_stride
                padded = torch.zeros((block, case.head_dim), dtype=pool.dtype, device=pool.device)
                padded[:heads] = values[token]
                room = pool.untyped_storage().nbytes() // pool.element_size()
                rows = min(block, (room - offset - case.head_dim) // head_stride + 1)  # (the storage's end stops it)
                torch.as_strided(pool, (rows, case.head_dim), (head_stride, pool.stride(-1)), offset).copy_(padded[:rows])


FP8_AND_PADDING = WriteCapabilities(dtypes=CACHE_DTYPES, padding=True)


class QuantisingLoop(PerTokenLoop):
    """Correct, written differently, for fp8 and padding too: per token from the lengths (padding rows are
    never reached), quantised as ``value / scale`` in float64."""

    name = "planted:quantising-loop"
    capabilities = FP8_AND_PADDING

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        for token, b, position in _each_token(case):
            page = int(inputs.kv_indices[int(inputs.kv_indptr[b]) + position // case.page_size])
            _put(case, inputs, page, position % case.page_size, token)


class PaddingToLastSlot(WriteKernel):
    """Scatters every row by ``slot_mapping`` without skipping the padding slot -1, which Python-style
    indexing turns into the last slot of the last page of the pool."""

    name = "planted:padding-to-last-slot"
    capabilities = FP8_AND_PADDING

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        pages, slots = inputs.slot_mapping // case.page_size, inputs.slot_mapping % case.page_size
        for pool, values, scale in ((inputs.k_pool, inputs.append_k, case.k_scale), (inputs.v_pool, inputs.append_v, case.v_scale)):
            values = (values.float() / scale).to(pool.dtype) if case.quantised else values
            _scatter(case, pool, values, pages, slots)


class InverseScale(WriteKernel):
    """Quantises with 1/scale: stores ``value * scale`` (the dequantising direction) in the fp8 cache."""

    name = "planted:inverse-scale"
    capabilities = FP8_AND_PADDING

    def append(self, case: AppendCase, inputs: AppendInputs) -> None:
        real = inputs.slot_mapping >= 0
        pages, slots = inputs.slot_mapping[real] // case.page_size, inputs.slot_mapping[real] % case.page_size
        for pool, values, scale in ((inputs.k_pool, inputs.append_k, case.k_scale), (inputs.v_pool, inputs.append_v, case.v_scale)):
            values = (values[real].float() * scale).to(pool.dtype) if case.quantised else values[real]
            _scatter(case, pool, values, pages, slots)


BUGS = (OneSlotPast, IgnoresLastPageLen, LayoutConfusion, AssumesContiguous)
UPSTREAM_BUGS = (NewSlotsContiguous, NextSlotLenModPage, CompactedRequestIndex, StoresNextPow2Heads)
NEW_DRAW_BUGS = (PaddingToLastSlot, InverseScale)  # caught only by padding rows, by fp8 scales != 1
CORRECT = (PerTokenLoop, QuantisingLoop)
