"""Write kernels with planted bugs (each must be caught) and a correct one written differently
(which must pass), for the KV-cache write check (``pa_oracle.fuzz.checks.append``). Not registered:
tests and ``pa-oracle writes --kernel MODULE:CLASS`` name them."""

from __future__ import annotations

import torch

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


BUGS = (OneSlotPast, IgnoresLastPageLen, LayoutConfusion, AssumesContiguous)
CORRECT = (PerTokenLoop,)
