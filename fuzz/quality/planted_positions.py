"""Planted EAGLE tree-verify kernels with fused RoPE (issue 34): draft node ``n`` of a request with prefix ``P``
is token ``P + depth(n)`` of the sequence, so EAGLE's and Medusa's verify rotate its query and its key there
(SGLang and vLLM build the positions from the tree's depths), never at its index ``P + n``.

Both take the draft tree (``tree_parents``) and FlashInfer's packed mask, rotate q and the key cache themselves
(``planted_rope._rotate``: float64 complex multiplication, written apart from ``pa_oracle.oracle.rope``), round
them to their dtypes as a kernel that rotates in place does, and attend with ``planted._paged_attention``.
``eagle_rope_by_index`` rotates by index: right for a chain (depth = index) and for every case drawn with the
index positions, wrong for any tree with a branch. Only the depth positions of ``Case.positions`` (drawn for a
kernel that names ``positions`` or ``tree_parents``) show it.
"""

from __future__ import annotations

from typing import Any

import torch
from pa_oracle.fuzz.quality.planted import _paged_attention
from pa_oracle.fuzz.quality.planted_rope import _rotate
from pa_oracle.oracle.case import Rope

BUGS = {
    "eagle_rope_by_index": "an EAGLE tree-verify kernel with fused RoPE rotates draft node n at prefix + n (its index) "
                           "instead of prefix + depth(n)",
}
CORRECT = ("correct_eagle_rope",)
PLANTED = tuple(BUGS)
_CAPABILITIES = {"rope": (True,), "custom_mask": (True,)}  # every case rotates and is masked (trees or arbitrary masks)


def _node_offsets(parents: list[int], by_index: bool) -> list[int]:
    """Each node's offset from the prefix: its depth (roots 0), or with ``by_index`` its index (the bug)."""
    if by_index:
        return list(range(len(parents)))
    depths: list[int] = []
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    return depths


def _rotated_tree(q: torch.Tensor, k_cache: torch.Tensor, layout: dict[str, torch.Tensor], tree_parents: torch.Tensor | None,
                  rope: Rope, by_index: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """q and a copy of the key cache rotated: a tree's node and its key (the request's last qo_len keys, in node
    order) at prefix + depth (or index), every other query and key at its index."""
    qo_indptr, kv_indptr, kv_indices, last = (layout[n] for n in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"))
    page_size = k_cache.shape[1]
    q_out, k_out = q.clone(), k_cache.clone()
    for b in range(len(qo_indptr) - 1):
        pages = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        kv_len = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + int(last[b])
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        prefix = kv_len - (q1 - q0)
        offsets = list(range(q1 - q0)) if tree_parents is None else _node_offsets(tree_parents[q0:q1].tolist(), by_index)
        q_pos = torch.tensor([prefix + o for o in offsets], dtype=torch.int64, device=q.device)
        q_out[q0:q1] = _rotate(q[q0:q1], q_pos, rope, rope.style).to(q.dtype)
        if kv_len:
            k_pos = torch.arange(kv_len, device=q.device)
            own = max(prefix, 0)
            k_pos[own:] = q_pos[own - prefix :]  # the nodes' own keys at their nodes' positions
            slots = torch.arange(kv_len, device=q.device)
            page_of, slot_of = pages[slots // page_size], slots % page_size
            k_out[page_of, slot_of] = _rotate(k_cache[page_of, slot_of], k_pos, rope, rope.style).to(k_cache.dtype)
    return q_out, k_out


def _eagle_verify(by_index: bool):  # type: ignore[no-untyped-def]
    """An EAGLE verify kernel: rotates by the tree (``by_index``: by index, the bug), then attends under the mask."""

    def kernel(q, k_cache, v_cache, *, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, causal, sm_scale,
               window_left, logits_soft_cap, custom_mask, mask_indptr, rope: Rope | None = None,
               tree_parents: torch.Tensor | None = None) -> Any:
        layout = {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr, "kv_indices": kv_indices, "kv_last_page_len": kv_last_page_len}
        if rope is not None:
            q, k_cache = _rotated_tree(q, k_cache, layout, tree_parents, rope, by_index)
        return _paged_attention(q, k_cache, v_cache, **layout, causal=causal, sm_scale=sm_scale, window_left=window_left,
                                logits_soft_cap=logits_soft_cap, custom_mask=custom_mask, mask_indptr=mask_indptr)

    kernel.__name__ = kernel.__qualname__ = "eagle_rope_by_index" if by_index else "correct_eagle_rope"
    kernel.pa_oracle_capabilities = dict(_CAPABILITIES)  # type: ignore[attr-defined]
    return kernel


eagle_rope_by_index = _eagle_verify(by_index=True)
correct_eagle_rope = _eagle_verify(by_index=False)
