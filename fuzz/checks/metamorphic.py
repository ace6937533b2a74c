"""Metamorphic relations run on kernels: the kernel's output on a case against its own output on
cases derived from it. No oracle is needed for the verdict, only for the tolerance of relations
that a correct kernel may keep up to rounding.

- ``reorder``: requests permuted (same pages) -> rows permuted. Tolerance: bit-exact for a
  per-request kernel, but a kernel may legitimately schedule by batch position.
- ``relabel``: physical page ids shuffled and page contents moved -> the same output, bit-exact:
  the kernel reads the same values in the same order, only from other addresses (a kernel that is
  not deterministic run to run is judged within tolerance instead, and the note says so).
- ``alone``: each request alone (same pool) -> its rows of the batch. Tolerance: split-KV and
  tile heuristics depend on the batch (``pa-oracle properties`` reports bit-exactness).
- ``merge``: each request's keys cut before its first query; prefix (non-causal: every prefix key
  precedes every query) and suffix (causal as the case) merged with the kernel library's own merge
  (``Backend.merge_states``) -> the whole. Tolerance: two partial outputs are rounded, then merged.
  A request with no key before its first query stays whole when the kernel takes no empty request.
- ``window``: ``window_left = w`` -> every query row alone (one query, the last position) over
  exactly its visible keys, no window. Each row is its own request because a prefill's rows see
  different key ranges; bottom-right alignment puts the sliced query at the original query's
  offset from its keys, so causal masks, ALiBi distances and RoPE's relative angles carry over
  (non-causal ALiBi and RoPE do not: they are dropped from such cases). Tolerance: another batch, other tiles.

Every derived case lives in fresh or permuted pages of its own, with unreferenced slots poisoned.
"""

from __future__ import annotations

import dataclasses
import random
from typing import NamedTuple

import torch
from pa_oracle.backends.base import Backend, Capabilities, ContractViolation, KernelOutput, Unsupported
from pa_oracle.fuzz.run.runner import Outcome
from pa_oracle.fuzz.checks.base import (
    Check,
    case_key,
    Relation,
    judge_relation,
    owned,
    run_supported,
    tensors_for,
)
from pa_oracle.fuzz.checks.properties import alone
from pa_oracle.oracle.case import Case, Layout, Options
from pa_oracle.oracle.tensors import POISON, Tensors, raw_bits, same_bits, token_addresses
from pa_oracle.oracle.tolerance import Tolerance


def _rng(case: Case, relation: str) -> random.Random:
    """The relation's randomness (permutations, cuts) comes from the case: a saved case replays it."""
    return random.Random(f"{relation}:{case_key(case)}")


def _moving_permutation(case: Case, relation: str, size: int) -> list[int]:
    """A permutation of ``range(size)`` drawn from the case, never the identity (size >= 2)."""
    order = list(range(size))
    _rng(case, relation).shuffle(order)
    if order == sorted(order):
        order.reverse()
    return order


def _indptr(lengths: list[int]) -> tuple[int, ...]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return tuple(out)


def _derived(case: Case, layout: Layout, options: Options | None = None) -> Case:
    """A case derived from ``case``: its tensors are explicit (never regenerated from the seed)."""
    return case.replace(layout=layout, options=options or case.options, tensors_file=None, meta={})


def _query_rows(case: Case, requests: list[int]) -> torch.Tensor:
    lay = case.layout
    parts = [torch.arange(lay.qo_indptr[b], lay.qo_indptr[b + 1]) for b in requests]
    return torch.cat(parts).long() if parts else torch.zeros(0, dtype=torch.long)


def _rows_of(result: KernelOutput, rows: torch.Tensor) -> KernelOutput:
    rows = rows.to(result.out.device)
    return KernelOutput(result.out[rows], None if result.lse is None else result.lse[rows.to(result.lse.device)])


# --- derived cases ----------------------------------------------------------------------------


def reorder_requests(case: Case, tensors: Tensors, order: list[int]) -> tuple[Case, Tensors, torch.Tensor]:
    """Requests in ``order`` (each keeps its pages); returns the case, its tensors and, per row of
    the new case, the row of ``case`` it came from."""
    lay = case.layout
    pages = [lay.pages_of(b) for b in order]
    layout = Layout(
        _indptr([lay.qo_lens[b] for b in order]), _indptr([len(p) for p in pages]),
        tuple(page for p in pages for page in p), tuple(lay.kv_last_page_len[b] for b in order),
        lay.page_size, lay.num_pages,
    )
    rows = _query_rows(case, order)
    q = tensors.q[rows.to(tensors.q.device)]
    return _derived(case, layout), Tensors(q, tensors.k_cache, tensors.v_cache), rows


def _take_pages(cache: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``cache[source]`` on raw bits (fp8 has no gather on every device)."""
    return raw_bits(cache)[source.to(cache.device)].view(cache.dtype)


def relabel_pages(case: Case, tensors: Tensors, new_id: list[int]) -> tuple[Case, Tensors]:
    """Physical page ``p`` becomes page ``new_id[p]``: the page table is rewritten and every page's
    contents (poison included) move with it."""
    lay = case.layout
    if sorted(new_id) != list(range(lay.num_pages)):
        raise ValueError(f"new_id must be a permutation of range({lay.num_pages})")
    layout = Layout(
        lay.qo_indptr, lay.kv_indptr, tuple(new_id[p] for p in lay.kv_indices), lay.kv_last_page_len,
        lay.page_size, lay.num_pages,
    )
    old_of_new = torch.empty(lay.num_pages, dtype=torch.long)
    old_of_new[torch.tensor(new_id, dtype=torch.long)] = torch.arange(lay.num_pages)
    moved = Tensors(tensors.q, _take_pages(tensors.k_cache, old_of_new), _take_pages(tensors.v_cache, old_of_new))
    return _derived(case, layout), moved


class Piece(NamedTuple):
    """One request of a repacked case: query rows of the original and a key range of one request."""

    rows: range
    request: int
    start: int  # first key position (of the original request)
    stop: int


def repack(case: Case, tensors: Tensors, pieces: list[Piece], options: Options) -> tuple[Case, Tensors]:
    """A case whose request ``i`` holds the query rows and keys of ``pieces[i]`` in fresh pages (page
    order shuffled from the case's seed, one unused page), every other slot poison."""
    lay, heads = case.layout, case.heads
    kv_lens = [p.stop - p.start for p in pieces]
    pages_needed = sum(-(-n // lay.page_size) for n in kv_lens)
    order = list(range(pages_needed + 1))
    _rng(case, "repack").shuffle(order)
    layout = Layout.from_lengths([len(p.rows) for p in pieces], kv_lens, lay.page_size, page_order=order, extra_pages=1)
    new = _derived(case, layout, options)
    first_token = _indptr(list(lay.kv_lens))
    source = [torch.arange(first_token[p.request] + p.start, first_token[p.request] + p.stop) for p in pieces]
    source_tokens = torch.cat(source).long() if source else torch.zeros(0, dtype=torch.long)
    old_pages, old_slots = token_addresses(case)
    new_pages, new_slots = token_addresses(new)
    device = tensors.q.device
    caches = []
    for cache in (tensors.k_cache, tensors.v_cache):
        pool = torch.full((layout.num_pages, lay.page_size, heads.num_kv_heads, cache.shape[-1]), POISON, device=device)
        pool = pool.to(cache.dtype)
        raw_bits(pool)[new_pages.to(device), new_slots.to(device)] = raw_bits(cache)[
            old_pages[source_tokens].to(device), old_slots[source_tokens].to(device)
        ]
        caches.append(pool)
    rows = [torch.arange(p.rows.start, p.rows.stop) for p in pieces]
    q_rows = torch.cat(rows).long() if rows else torch.zeros(0, dtype=torch.long)
    return new, Tensors(tensors.q[q_rows.to(device)], caches[0], caches[1])


def _request_rows(case: Case, b: int) -> range:
    return range(case.layout.qo_indptr[b], case.layout.qo_indptr[b + 1])


# --- the relations -----------------------------------------------------------------------------


def _reorder(backend: Backend, case: Case, tolerance: Tolerance) -> Outcome:
    batch = case.layout.batch_size
    if batch < 2:
        raise Unsupported("one request: nothing to reorder")
    order = _moving_permutation(case, "reorder", batch)
    tensors = tensors_for(backend, case)
    reordered, moved, rows = reorder_requests(case, tensors, order)
    cases = [("original", case, tensors), ("reordered", reordered, moved)]
    whole = run_supported(backend, case, tensors, "original")
    permuted = run_supported(backend, reordered, moved, "reordered")
    return judge_relation(
        "reorder", backend, Relation(case, tensors, _rows_of(whole, rows), permuted, rows, cases),
        exact_required=False, tolerance=tolerance, note=f"request order {order}",
    )


def _relabel(backend: Backend, case: Case, tolerance: Tolerance) -> Outcome:
    num_pages = case.layout.num_pages
    if num_pages < 2:
        raise Unsupported("one page in the pool: nothing to relabel")
    new_id = _moving_permutation(case, "relabel", num_pages)
    reason = backend.unsupported_reason(case)
    if reason:
        raise Unsupported(reason)
    tensors = tensors_for(backend, case)
    relabeled, moved = relabel_pages(case, tensors, new_id)
    cases = [("original", case, tensors), ("relabeled", relabeled, moved)]
    plan = backend.plan(case)
    first = owned(backend.run(plan, tensors.copy()))  # the kernel gets copies: ``tensors`` are the judge's
    deterministic = same_bits(first.out, backend.run(plan, tensors.copy()).out)
    other = run_supported(backend, relabeled, moved, "relabeled")
    rows = torch.arange(case.layout.total_q)
    note = "" if deterministic else "the kernel is not deterministic run to run: judged within tolerance"
    return judge_relation(
        "relabel", backend, Relation(case, tensors, first, other, rows, cases),
        exact_required=deterministic, tolerance=tolerance, note=note,
    )


def _alone(backend: Backend, case: Case, tolerance: Tolerance) -> Outcome:
    lay = case.layout
    requests = [b for b in range(lay.batch_size) if lay.qo_lens[b] > 0]
    if lay.batch_size < 2:
        raise Unsupported("one request: it is always alone")
    tensors = tensors_for(backend, case)
    whole = run_supported(backend, case, tensors, "original")
    cases: list[tuple[str, Case, Tensors | None]] = [("original", case, tensors)]
    outs, lses = [], []
    for b in requests:
        single = alone(case, b)
        rows = _request_rows(case, b)
        single_tensors = Tensors(tensors.q[rows.start : rows.stop], tensors.k_cache, tensors.v_cache)
        cases.append((f"alone-{b}", single, single_tensors))
        result = run_supported(backend, single, single_tensors, f"request {b} alone")
        outs.append(result.out)
        lses.append(result.lse)
    all_rows = _query_rows(case, requests)
    together = KernelOutput(
        torch.cat(outs) if outs else whole.out[:0],
        None if any(x is None for x in lses) or not lses else torch.cat(lses),  # type: ignore[arg-type]
    )
    return judge_relation(
        "alone", backend, Relation(case, tensors, _rows_of(whole, all_rows), together, all_rows, cases),
        exact_required=False, tolerance=tolerance,
    )


def _merge(backend: Backend, case: Case, tolerance: Tolerance) -> Outcome:
    lay, opts = case.layout, case.options
    if opts.window_left >= 0 or opts.alibi_slopes is not None or opts.sinks is not None or opts.rope is not None:
        raise Unsupported("window, ALiBi, RoPE and sinks depend on the absolute position or add to every part: no split")
    rng = _rng(case, "merge")
    low = 0 if backend.capabilities.empty_requests else 1  # 0: an empty prefix, the merge's own edge case
    prefix, suffix = [], []
    for b in range(lay.batch_size):
        qo, kv = lay.qo_lens[b], lay.kv_lens[b]
        high = kv if qo == 0 else max(kv - qo, 0)  # every prefix key precedes every query
        cut = rng.randint(low, high) if high >= low else 0  # 0 here: the request stays whole, in the suffix
        if high >= low:
            prefix.append(Piece(_request_rows(case, b), b, 0, cut))
        suffix.append(Piece(_request_rows(case, b), b, cut, kv))
    if not prefix:
        raise Unsupported("no request has a key before its first query to split off")
    tensors = tensors_for(backend, case)
    prefix_case, prefix_tensors = repack(case, tensors, prefix, dataclasses.replace(opts, causal=False))
    suffix_case, suffix_tensors = repack(case, tensors, suffix, opts)
    cases = [("original", case, tensors), ("prefix", prefix_case, prefix_tensors), ("suffix", suffix_case, suffix_tensors)]
    whole = run_supported(backend, case, tensors, "original")
    first = run_supported(backend, prefix_case, prefix_tensors, "prefix")
    second = run_supported(backend, suffix_case, suffix_tensors, "suffix")
    if first.lse is None or second.lse is None:
        raise Unsupported("the kernel returns no LSE: its partial states cannot be merged")
    split_rows = _query_rows(case, [p.request for p in prefix]).to(second.out.device)
    part = backend.merge_states(first.out, first.lse, second.out[split_rows], second.lse[split_rows.to(second.lse.device)])
    out, lse = second.out.clone(), second.lse.clone()  # (second.lse is not None: checked above)
    if part.lse is None:
        raise ContractViolation("merge_states returned no LSE for two partial states that had one")
    out[split_rows], lse[split_rows.to(lse.device)] = part.out.to(out.dtype), part.lse.to(lse.dtype)
    cuts = {p.request: p.stop for p in prefix}
    return judge_relation(
        "merge", backend, Relation(case, tensors, whole, KernelOutput(out, lse), torch.arange(lay.total_q), cases),
        exact_required=False, tolerance=tolerance, note=f"keys cut at {cuts} (request: prefix length)",
    )


def windowed(case: Case) -> Case:
    """The case with a sliding window: its own, or ``window_left`` drawn from the case's seed."""
    opts = case.options
    window = opts.window_left
    if window < 0:
        window = _rng(case, "window").randint(0, max(max(case.layout.kv_lens) - 1, 0))
    alibi = opts.alibi_slopes if opts.causal else None  # see the module docstring
    rope = opts.rope if opts.causal else None  # RoPE, relative like ALiBi's distance: the same rule
    return case.replace(options=dataclasses.replace(opts, window_left=window, alibi_slopes=alibi, rope=rope))


def window_pieces(case: Case, *, keep_empty: bool) -> list[Piece]:
    """Each query row with exactly the keys its window (and causal mask) lets it see."""
    lay, opts = case.layout, case.options
    pieces = []
    for row in range(lay.total_q):
        b, p = lay.request_of_row(row), lay.position_of_row(row)
        start = max(0, p - opts.window_left)
        stop = min(p + 1, lay.kv_lens[b]) if opts.causal else lay.kv_lens[b]
        if stop <= start:
            if not keep_empty:
                continue
            start = stop = 0
        pieces.append(Piece(range(row, row + 1), b, start, stop))
    return pieces


def _window(backend: Backend, case: Case, tolerance: Tolerance) -> Outcome:
    case = windowed(case)
    pieces = window_pieces(case, keep_empty=backend.capabilities.empty_requests)
    if not pieces:
        raise Unsupported("no query row sees a key")
    tensors = tensors_for(backend, case)
    sliced, sliced_tensors = repack(case, tensors, pieces, dataclasses.replace(case.options, window_left=-1))
    cases = [("original", case, tensors), ("sliced", sliced, sliced_tensors)]
    whole = run_supported(backend, case, tensors, "original")
    per_row = run_supported(backend, sliced, sliced_tensors, "sliced")
    rows = torch.tensor([p.rows.start for p in pieces], dtype=torch.long)
    return judge_relation(
        "window", backend, Relation(case, tensors, _rows_of(whole, rows), per_row, rows, cases),
        exact_required=False, tolerance=tolerance, note=f"window_left {case.options.window_left}",
    )


def _merge_capabilities(backend: Backend) -> Capabilities | str:
    caps = backend.capabilities
    if not caps.returns_lse:
        return "the kernel returns no LSE: its partial states cannot be merged"
    if False not in caps.causal:
        return "the prefix is a non-causal call, which the kernel does not declare"
    if False not in caps.rope:
        return "RoPE rotates by absolute position: a prefix call moves its queries"
    return caps.replace(window_left=False, alibi=False, sinks=False, rope=(False,))


def _window_capabilities(backend: Backend) -> Capabilities | str:
    return backend.capabilities if backend.capabilities.window_left else "the kernel declares no sliding window"


RELATIONS = (
    Check("reorder", "tolerance", "a kernel may schedule work by batch position; bit-exactness is reported", _reorder),
    Check("relabel", "bit-exact", "the same values are read in the same order, only from other pages", _relabel),
    Check("alone", "tolerance", "split-KV and tile choices depend on the batch; bit-exactness is reported", _alone),
    Check("merge", "tolerance", "two partial outputs are rounded, then merged", _merge, _merge_capabilities),
    Check("window", "tolerance", "another batch and other key offsets give other tiles", _window, _window_capabilities),
)

__all__ = ["RELATIONS", "Piece", "relabel_pages", "reorder_requests", "repack", "window_pieces", "windowed"]

