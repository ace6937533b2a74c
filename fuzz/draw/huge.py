"""The huge-pool tier: cases whose page index times page stride passes 2**31 elements, where
kernels that compute ``page * stride`` in int32 read the wrong page or crash (FlashInfer#3136,
vLLM#1514, flash-attention#772). They need GPU memory (several GiB per cache).
"""

from __future__ import annotations

from pa_oracle.oracle.case import Case, Heads, Layout, Options

INT32_LIMIT = 2**31


def page_stride(case: Case) -> int:
    """Elements between consecutive pages of the NHD K cache."""
    return case.layout.page_size * case.heads.num_kv_heads * case.heads.head_dim_qk


def huge_pool_case(
    *, page_size: int = 16, heads: Heads = Heads(32, 8, 128, 128), options: Options = Options(causal=True),
    qo_lens: tuple[int, ...] = (1, 7, 1), kv_lens: tuple[int, ...] = (300, 40, 17), margin_pages: int = 64,
) -> Case:
    """Requests whose pages lie just past the int32 element boundary, in reverse order, with the
    low pool unused (poison)."""
    stride = page_size * heads.num_kv_heads * heads.head_dim_qk
    first_high_page = INT32_LIMIT // stride + 1
    needed = sum(-(-n // page_size) for n in kv_lens)
    num_pages = first_high_page + needed + margin_pages
    high = list(range(num_pages - 1, num_pages - 1 - needed, -1))
    indptr, last = [0], []
    for n in kv_lens:
        indptr.append(indptr[-1] + -(-n // page_size))
        last.append(0 if n == 0 else (n - 1) % page_size + 1)
    qo_indptr = [0]
    for n in qo_lens:
        qo_indptr.append(qo_indptr[-1] + n)
    layout = Layout(tuple(qo_indptr), tuple(indptr), tuple(high), tuple(last), page_size, num_pages)
    return Case(layout, heads, options, seed=31)
