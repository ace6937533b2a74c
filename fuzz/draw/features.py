"""What a case exercises, as named features: the vocabulary of ledger ``matches`` predicates
(``pa_oracle.fuzz.campaign.ledger``) and of the campaign coverage table (``pa_oracle.fuzz.campaign.coverage``)."""

from __future__ import annotations

from pa_oracle.oracle.case import (
    DISTRIBUTIONS, FP8_DTYPES, KV_DTYPES, KV_LAYOUTS, KV_STORAGES, Q_DTYPES, Q_STORAGES, ROPE_STYLES, Case, Storage,
)

Feature = int | bool | str

# name -> type; a str feature lists its allowed values instead
FEATURES: dict[str, type | tuple[str, ...]] = {
    "batch_size": int,
    "min_kv_len": int,
    "max_kv_len": int,
    "min_qo_len": int,
    "max_qo_len": int,
    "empty_requests": bool,  # some request has kv_len 0 or qo_len 0
    "kv_len_0_with_queries": bool,  # some request has queries but no key at all
    "qo_above_kv": bool,  # some request has qo_len > kv_len (its first rows sit before position 0)
    "page_size": int,
    "group_size": int,
    "num_kv_heads": int,
    "head_dim": int,  # head_dim_qk
    "head_dim_vo": int,
    "q_dtype": Q_DTYPES + FP8_DTYPES,  # an fp8 q: flashinfer-prefill-fa3-fp8
    "kv_dtype": KV_DTYPES,
    "causal": bool,
    "window": bool,  # window_left >= 0
    "logits_soft_cap": bool,
    "alibi": bool,
    "sinks": bool,
    "custom_scale": bool,  # sm_scale given, not 1/sqrt(head_dim_qk)
    "fp8_scales": bool,  # k_scale or v_scale other than 1
    "distribution": DISTRIBUTIONS,
    "custom_mask": ("none", "tree", "bits"),  # how the case's custom mask is given (oracle.case.CustomMask)
    "mla": bool,  # the latent layout (Heads.mla)
    "mask_empty_row": bool,  # a custom mask leaves some query row no key (before causal and window)
    "rope": ("none", *ROPE_STYLES),  # the case's RoPE pairing (oracle.case.Rope), "none" without RoPE
    # where the tensors lie in memory (oracle.case.Storage)
    "kv_storage": KV_STORAGES,  # separate K and V, or one [pages, 2, ...] tensor
    "kv_layout": KV_LAYOUTS,
    "q_storage": Q_STORAGES,  # contiguous, or a view of a fused QKV buffer
    "pool_offset": int,  # elements before the caches in their pool
}


def case_features(case: Case) -> dict[str, Feature]:
    """Every feature of ``FEATURES`` for ``case``.

    >>> from pa_oracle.oracle.case import Heads, Layout
    >>> f = case_features(Case(Layout.from_lengths([1, 2], [0, 1], 16), Heads(5, 1, 64, 64)))
    >>> f["kv_len_0_with_queries"], f["qo_above_kv"], f["group_size"], f["min_kv_len"]
    (True, True, 5, 0)
    """
    lay, heads, opts = case.layout, case.heads, case.options
    storage = case.storage or Storage()
    return {
        "batch_size": lay.batch_size,
        "min_kv_len": min(lay.kv_lens),
        "max_kv_len": max(lay.kv_lens),
        "min_qo_len": min(lay.qo_lens),
        "max_qo_len": max(lay.qo_lens),
        "empty_requests": any(k == 0 or q == 0 for q, k in zip(lay.qo_lens, lay.kv_lens)),
        "kv_len_0_with_queries": any(k == 0 and q > 0 for q, k in zip(lay.qo_lens, lay.kv_lens)),
        "qo_above_kv": any(q > k for q, k in zip(lay.qo_lens, lay.kv_lens)),
        "page_size": lay.page_size,
        "group_size": heads.group_size,
        "num_kv_heads": heads.num_kv_heads,
        "head_dim": heads.head_dim_qk,
        "head_dim_vo": heads.head_dim_vo,
        "q_dtype": opts.q_dtype,
        "kv_dtype": opts.kv_dtype,
        "causal": opts.causal,
        "window": opts.window_left >= 0,
        "logits_soft_cap": opts.logits_soft_cap > 0,
        "alibi": opts.alibi_slopes is not None,
        "sinks": opts.sinks is not None,
        "custom_scale": opts.sm_scale is not None,
        "fp8_scales": opts.k_scale != 1.0 or opts.v_scale != 1.0,
        "distribution": case.distribution,
        "custom_mask": "none" if case.custom_mask is None else "tree" if case.custom_mask.tree_parents is not None else "bits",
        "mla": heads.mla,
        "mask_empty_row": _mask_empty_row(case),
        "rope": "none" if opts.rope is None else opts.rope.style,
        "kv_storage": storage.kv,
        "kv_layout": storage.kv_layout,
        "q_storage": storage.q,
        "pool_offset": storage.pool_offset,
    }


def _mask_empty_row(case: Case) -> bool:
    masks = case.masks() if case.custom_mask is not None else None
    return bool(masks) and any(m.shape[1] > 0 and not m.any(axis=1).all() for m in masks if m.shape[0])
