"""Hypothesis strategy for KV-cache writes: ragged appends within a write kernel's capabilities,
weighted towards the edges where writes go wrong (a last page filled exactly, an append that
opens a fresh page or spans several, an empty request, an empty append)."""

from __future__ import annotations

from hypothesis import strategies as st

from pa_oracle.backends.writes import WriteCapabilities
from pa_oracle.oracle.append import AppendCase


@st.composite
def append_cases(draw: st.DrawFn, caps: WriteCapabilities, max_batch: int = 6, max_len: int = 40) -> AppendCase:
    page = draw(st.sampled_from(caps.page_sizes), label="page_size")
    batch = draw(st.integers(1, max_batch), label="batch")

    def length(label: str) -> st.SearchStrategy[int]:
        edges = st.sampled_from([0, 1, page - 1, page, page + 1, 2 * page]).filter(lambda n: n >= 0)
        return st.one_of(edges, st.integers(0, max(max_len, page + 1)))

    before = tuple(draw(length("before")) for _ in range(batch))
    if caps.same_append_len:
        appends = (draw(st.integers(1, max(2, min(max_len, 2 * page))), label="append"),) * batch
    else:
        appends = tuple(draw(length("append")) for _ in range(batch))
    if sum(appends) == 0:
        appends = (1,) + appends[1:]
    return AppendCase(
        seq_lens_before=before,
        append_lens=appends,
        page_size=page,
        num_kv_heads=draw(st.sampled_from([1, 2, 3, 4, 8]), label="heads"),
        head_dim=draw(st.sampled_from(caps.head_dims), label="head_dim"),
        dtype=draw(st.sampled_from(caps.dtypes), label="dtype"),
        kv_layout=draw(st.sampled_from(caps.layouts), label="layout"),
        combined=draw(st.sampled_from(caps.combined), label="combined"),
        spare_pages=draw(st.integers(0, 3), label="spare"),
        seed=draw(st.integers(0, 2**32 - 1), label="seed"),
    )
