"""Kernel properties that are reported, not judged: determinism (the same call twice gives the
same bits) and batch invariance (a request alone gives the bits it gets inside the batch).
Many correct kernels have neither (split-KV heuristics depend on the batch); a kernel that
claims one can be held to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pa_oracle.backends.base import Backend
from pa_oracle.oracle.case import Case, Layout
from pa_oracle.oracle.tensors import Tensors, make_tensors, same_bits


@dataclass(frozen=True)
class Properties:
    deterministic: bool
    batch_invariant: bool | None  # None: a batch of one request


def alone(case: Case, request: int) -> Case:
    """The case reduced to one request, over the same page pool."""
    lay = case.layout
    single = Layout(
        (0, lay.qo_lens[request]), (0, lay.num_pages_per_request[request]), lay.pages_of(request),
        (lay.kv_last_page_len[request],), lay.page_size, lay.num_pages,
    )
    return case.replace(layout=single)


def measure(backend: Backend, case: Case, tensors: Tensors | None = None) -> Properties:
    """Run ``case`` twice, then each request alone, on ``backend`` (which must support it)."""
    tensors = tensors if tensors is not None else make_tensors(case, backend.device or "cpu")
    plan = backend.plan(case)
    first = backend.run(plan, tensors).out.clone()  # a kernel may write each call into one buffer per shape
    deterministic = same_bits(first, backend.run(plan, tensors).out)
    lay = case.layout
    if lay.batch_size == 1:
        return Properties(deterministic, None)
    invariant = True
    for b in range(lay.batch_size):
        rows = slice(lay.qo_indptr[b], lay.qo_indptr[b + 1])
        if lay.qo_lens[b] == 0:
            continue
        single = alone(case, b)
        out = backend.run(backend.plan(single), Tensors(tensors.q[rows], tensors.k_cache, tensors.v_cache)).out
        invariant &= same_bits(out, first[rows])
    return Properties(deterministic, invariant)
