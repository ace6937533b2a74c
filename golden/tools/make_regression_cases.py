"""Write the seed-generated regression cases of golden/cases/ (one per bug class of the field
catalogue that no finding covers yet). Re-running it rewrites the same files: the same cases and ids,
their meta in the finding record's current shape (``pa_oracle.fuzz.campaign.finding_record``, which
reads the older one the files hold).

    python golden/tools/make_regression_cases.py
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TypedDict

from pa_oracle.fuzz.campaign.finding_record import FindingMeta, FoundBy
from pa_oracle.oracle.case import Case, Heads, Layout, Options

CASES = Path(__file__).resolve().parents[1] / "cases"


class Dtypes(TypedDict):
    """The dtype fields of ``Options``, typed so that ``Options(**BF16)`` is checked key by key."""

    q_dtype: str
    kv_dtype: str


BF16: Dtypes = {"q_dtype": "bfloat16", "kv_dtype": "bfloat16"}


def shuffled(qo: list[int], kv: list[int], page: int, extra: int = 2, seed: int = 0) -> Layout:
    """A layout of these lengths whose pages (``extra`` unused ones included) are placed in a seeded shuffle."""
    pages = sum(-(-n // page) for n in kv) + extra
    order = list(range(pages))
    random.Random(seed).shuffle(order)
    return Layout.from_lengths(qo, kv, page, page_order=order, extra_pages=extra)


REGRESSION = {
    "regress-split-kv-mid-tile-batch3": (
        Case(shuffled([1, 1, 1], [300, 257, 129], 16), Heads(8, 2, 64, 64), Options(**BF16), seed=3),
        "split-KV chunks ending mid-tile, batch > 1 (a combine that folds requests onto request 0)",
        "https://github.com/flashinfer-ai/flashinfer/issues/3890 ; https://github.com/vllm-project/flash-attention/pull/176",
    ),
    "regress-decode-tail-not-multiple-of-256": (
        Case(shuffled([1, 1], [300, 511], 16), Heads(4, 1, 128, 128), Options(**BF16), seed=4),
        "non-causal decode whose kv_len is not a multiple of 256 (padding lanes in the denominator)",
        "https://github.com/flashinfer-ai/flashinfer/issues/3717",
    ),
    "regress-speculative-qo3-causal": (
        Case(shuffled([3, 3, 3], [40, 17, 3], 16), Heads(8, 2, 64, 64), Options(causal=True, **BF16), seed=5),
        "q_len_per_req > 1 (speculative decode) with bottom-right causal masks on every request",
        "https://github.com/flashinfer-ai/flashinfer/issues/3871",
    ),
    "regress-mtp-qo6-per-request-offsets": (
        Case(shuffled([6, 6, 6], [700, 650, 600], 16), Heads(8, 1, 64, 64), Options(causal=True, **BF16), seed=6),
        "MTP q_len 6 at batch 3: every request after the first must use its own offsets",
        "https://github.com/flashinfer-ai/flashinfer/issues/4382",
    ),
    "regress-max-qo-len-in-the-middle": (
        Case(shuffled([1, 40, 2], [5, 60, 9], 16), Heads(4, 2, 64, 64), Options(causal=True, **BF16), seed=7),
        "the longest qo_len is not the last request (max_q_len = max(diff(qo_indptr)), not max(qo_indptr))",
        "https://github.com/flashinfer-ai/flashinfer/issues/1930",
    ),
    "regress-gqa-group-7-causal-prefill": (
        Case(shuffled([19, 5], [40, 5], 16), Heads(14, 2, 64, 64), Options(causal=True, **BF16), seed=8),
        "GQA group size 7 in causal prefill (CTA tiles not a multiple of the group)",
        "https://github.com/flashinfer-ai/flashinfer/issues/1148",
    ),
    "regress-gqa-group-6-decode": (
        Case(shuffled([1, 1, 1], [33, 1, 17], 16), Heads(12, 2, 64, 64), Options(**BF16), seed=9),
        "GQA group size 6 in decode (dispatch coverage; every head reads kv head h // 6)",
        "https://github.com/flashinfer-ai/flashinfer/issues/2684",
    ),
    "regress-soft-cap-before-mask": (
        Case(shuffled([4, 1], [20, 33], 16), Heads(4, 2, 64, 64), Options(causal=True, logits_soft_cap=5.0, **BF16), seed=10),
        "soft cap applied to the logits before the causal mask, not after",
        "https://github.com/flashinfer-ai/flashinfer/issues/350",
    ),
    "regress-window-edge-over-pages": (
        Case(shuffled([3, 1, 2], [16, 17, 33], 16), Heads(4, 1, 64, 64), Options(causal=True, window_left=15, **BF16), seed=11),
        "sliding window of 15 keys to the left (16 visible) whose edge falls on page boundaries",
        "https://github.com/vllm-project/vllm/issues/3385",
    ),
    "regress-fp8-kv-scales": (
        Case(shuffled([1, 2], [30, 18], 16), Heads(4, 2, 64, 64), Options(causal=True, q_dtype="bfloat16", kv_dtype="float8_e4m3fn", k_scale=0.75, v_scale=0.5), seed=12),
        "fp8 e4m3 KV with k_scale 0.75 and v_scale 0.5, against a reference that dequantizes the same bytes",
        "https://github.com/flashinfer-ai/flashinfer/issues/1416",
    ),
    "regress-page-256-short-sequences": (
        Case(shuffled([1, 2, 1], [5, 3, 300], 256, extra=1), Heads(4, 2, 64, 64), Options(causal=True, **BF16), seed=13),
        "page size 256 with sequences shorter than one page (zeros reported for short sequences)",
        "https://github.com/flashinfer-ai/flashinfer/issues/725",
    ),
    "regress-page-1": (
        Case(shuffled([1, 3], [7, 9], 1, extra=3), Heads(4, 2, 64, 64), Options(causal=True, **BF16), seed=14),
        "page size 1 (every token its own page, shuffled)",
        "https://github.com/flashinfer-ai/flashinfer/issues/4347",
    ),
}


def main() -> None:
    found_by = FoundBy(command="golden/tools/make_regression_cases.py")
    for name, (case, guards, source) in REGRESSION.items():
        meta = FindingMeta(found_by=found_by, guards=guards, source=source).to_json()
        case.replace(meta=meta).save(CASES / f"{name}.json")
        print(f"wrote {name}: {case.summary()}")


if __name__ == "__main__":
    main()
