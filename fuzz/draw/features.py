"""What a case exercises, as named features: the vocabulary of ledger ``matches`` predicates
(``pa_oracle.fuzz.campaign.ledger``) and of the campaign coverage table (``pa_oracle.fuzz.campaign.coverage``)."""

from __future__ import annotations

import operator

from pa_oracle.oracle.case import (
    DISTRIBUTIONS, FP8_DTYPES, KV_DTYPES, KV_LAYOUTS, KV_STORAGES, Q_DTYPES, Q_STORAGES, ROPE_STYLES, Case, Storage,
)
from pa_oracle.oracle.visibility import attended

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
    "masked_row_without_key": bool,  # a case with a custom mask has a query row that attends no key (after causal, window)
    # FlashInfer MLA's causal tile bound drops a key some row needs (``mla_causal_tile_lost_keys``), per backend
    "mla_causal_tile_key_lost_fa2": bool,
    "mla_causal_tile_key_lost_fa3": bool,
    # SGLang's Triton extend pads head_dim_qk to a wider block than head_dim_vo (``sglang_extend_blocks``)
    "sglang_extend_qk_block_above_vo": bool,
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
        "masked_row_without_key": case.custom_mask is not None and any(
            m.shape[0] and not m.any(axis=1).all() for m in attended(case)),
        "mla_causal_tile_key_lost_fa2": bool(mla_causal_tile_lost_keys(case, "fa2")),
        "mla_causal_tile_key_lost_fa3": bool(mla_causal_tile_lost_keys(case, "fa3")),
        "sglang_extend_qk_block_above_vo": operator.gt(*sglang_extend_blocks(heads.head_dim_qk, heads.head_dim_vo)),
        "rope": "none" if opts.rope is None else opts.rope.style,
        "kv_storage": storage.kv,
        "kv_layout": storage.kv_layout,
        "q_storage": storage.q,
        "pool_offset": storage.pool_offset,
    }


def _mask_empty_row(case: Case) -> bool:
    masks = case.masks() if case.custom_mask is not None else None
    return masks is not None and any(m.shape[1] > 0 and not m.any(axis=1).all() for m in masks if m.shape[0])


def sglang_extend_blocks(head_dim_qk: int, head_dim_vo: int) -> tuple[int, int]:
    """(BLOCK_DMODEL, BLOCK_DV) of SGLang's Triton extend kernel (0.5.10.post1
    ``_get_block_sizes_for_extend_attention``): the next powers of two, with 576, 288 and 192 split into a
    power of two and a rope part (512 + 64, 256 + 32, 128 + 64).

    >>> sglang_extend_blocks(40, 24), sglang_extend_blocks(576, 512), sglang_extend_blocks(192, 128)
    ((64, 32), (512, 512), (128, 128))"""
    split = {576: 512, 288: 256, 192: 128}
    pow2 = lambda n: 1 << max(n - 1, 0).bit_length()  # noqa: E731 - triton.next_power_of_2
    return split.get(head_dim_qk, pow2(head_dim_qk)), pow2(head_dim_vo)


def mla_causal_tile_lost_keys(case: Case, backend: str = "fa3") -> list[tuple[int, int, int]]:
    """(request, token, qo head) rows whose last key FlashInfer's MLA kernels (``backend`` "fa2" or
    "fa3", on sm90) never load, for a causal MLA case without a custom mask (empty otherwise).

    The model of ``include/flashinfer/attention/mla.cuh`` (fa2, line 1071 in 0.6.18.post1, 1067 in
    0.7.2.post1) and ``mla_hopper.cuh`` (fa3, lines 914 and 1072; 916 and 1074): rows are packed as
    ``token * num_heads + head``; a tile of ``cluster_tile_q`` rows (128 when the batch's mean packed
    qo length, integer-divided, qo_len-0 requests included, exceeds 64, else 64: ``MLAPlan`` in
    ``scheduler.cuh``) loads keys up to ``kv_len - qo_len + (tile_start + cluster_tile_q) / num_heads``,
    floor-divided, rounded up to whole key tiles: 64 keys (fa3 always; fa2 on sm90's shared memory,
    ``DISPATCH_SMEM_CONFIG``, except 32 for an e4m3 cache, ``EFF_CTA_TILE_KV``; fa2's 32- and 16-key tiles
    on sm80/86/89 are not modelled). The plan itself uses ``ceil_div`` (``packed_causal_kv_end``). When
    ``num_heads`` does not divide the tile end, the token split across two tiles needs one key more and
    misses it when the floor bound is a multiple of the key tile: its rows in the first tile lose their
    diagonal key. The last tile of a request loads every key; split-KV chunks start on key-tile bounds,
    so they change nothing.
    """
    opts, heads, lay = case.options, case.heads, case.layout
    if not (heads.mla and opts.causal) or case.custom_mask is not None or lay.batch_size == 0:
        return []
    h = heads.num_qo_heads
    tile = 128 if sum(lay.qo_lens) * h // lay.batch_size > 64 else 64
    key_tile = 32 if backend == "fa2" and opts.kv_dtype == "float8_e4m3fn" else 64
    lost = []
    for b, (qo, kv) in enumerate(zip(lay.qo_lens, lay.kv_lens)):
        packed = qo * h
        for start in range(0, packed - tile, tile):  # every tile but the last
            end = start + tile
            bound = kv - qo + end // h
            if end % h and 0 <= bound < kv and bound % key_tile == 0:
                token = end // h
                lost += [(b, token, row - token * h) for row in range(max(start, token * h), end)]
    return lost
