"""Hypothesis strategy for KV-cache writes: ragged appends within a write kernel's capabilities,
weighted towards the edges where writes go wrong (a last page filled exactly, an append that
opens a fresh page or spans several, an empty request, an empty append).

A kernel whose capabilities list an fp8 cache dtype also draws, for those cases, the dtype of the
appended values and the K and V scales (1 among them, each exact in float32 so that the judge's
float64 quotient is the kernel's); one that declares ``padding`` draws 0-3 padding rows (slot -1).
Both are drawn after every other field and only then: a kernel that declares neither draws the cases
it drew before they existed (``tests/test_write_kernels.py`` pins them)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from pa_oracle.backends.writes import WriteCapabilities
from pa_oracle.oracle.append import DTYPES, FP8_CACHE_DTYPES, AppendCase

# |randn| stays far below 448 (e4m3's largest value) times the smallest scale; 1.0 hides scale misuse, so
# it is one value among several
SCALES = (1.0, 0.5, 2.0, 0.3125, 1.75, 0.0625, 3.5)


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
    fields: dict[str, Any] = dict(
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
    return AppendCase(**fields, **_newer_dimensions(draw, fields["dtype"], caps))


def _newer_dimensions(draw: st.DrawFn, dtype: str, caps: WriteCapabilities) -> dict[str, Any]:
    """The fp8 fields (an fp8 ``dtype``) and padding rows (``caps.padding``); nothing drawn otherwise."""
    changes: dict[str, Any] = {}
    if dtype in FP8_CACHE_DTYPES:
        changes.update(append_dtype=draw(st.sampled_from(DTYPES), label="append_dtype"),
                       k_scale=draw(st.sampled_from(SCALES), label="k_scale"),
                       v_scale=draw(st.sampled_from(SCALES), label="v_scale"))
    if caps.padding:
        changes["padding"] = draw(st.integers(0, 3), label="padding")
    return changes
