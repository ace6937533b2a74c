"""Strategies for the attention families of issue 14: MLA (the latent layout), draft-tree and
arbitrary custom masks (speculative decoding), on top of a case ``strategies.cases`` drew.

Verification model: ``extend(case, caps)`` turns a drawn case into one of a family only where
``caps`` asks for it (``Capabilities.mla`` / ``custom_mask``: both off by default, so no existing
kernel's seeds change). It keeps the case's options (windows, fp8 KV, sinks with GQA, soft cap),
so masks meet windows and fp8, and MLA meets sinks and q_len > 1.

- MLA: one latent KV head, (head_dim_qk, head_dim_vo) from ``MLA_DIMS`` (DeepSeek's absorbed
  decode 576/512, its prefill 192/128, and small pairs for CPU), within ``caps.mla_dims``.
- MLA with RoPE (DeepSeek's split): a kernel that declares both ``rope`` and ``mla`` keeps the drawn
  ``Rope`` on its MLA cases, rotating only ``q_pe`` / ``kpe`` (``Rope.span``); a partial ``rotary_dim`` is
  drawn again within ``d_kpe``. Kernels without ``rope`` (the library MLA adapters) never draw it.
- MLA with an fp8 q: a kernel that declares ``mla`` and fp8 ``q_dtypes`` keeps the drawn fp8 q (``q_scale``,
  ``o_dtype``) on its MLA cases, one scale for ``[q_nope | q_pe]`` (``oracle.case``). No library MLA adapter
  declares it: FlashInfer 0.6.18.post1's ``BatchMLAPagedAttentionWrapper`` takes no q scale (``plan`` refuses an
  fp8 latent cache unless ``q_data_type`` is bf16) and SGLang 0.5.10.post1's Triton ``decode_attention_fwd`` /
  ``extend_attention_fwd`` take ``k_scale`` / ``v_scale`` only.
- Trees: per request a draft tree of depth 1-8 and width 1-4 (at most ``MAX_TREE_NODES``
  nodes, q_len_per_req up to 16) behind a prefix of keys; the queries are the tree's nodes. A RoPE
  tree case of a kernel that takes positions (``Capabilities.rope_positions``) rotates node ``n`` at
  ``prefix + depth(n)`` as EAGLE's verify does (``Case.positions``; no draw of its own, so the seeds
  draw the same trees); any other kernel's trees keep the index positions.
- Arbitrary masks: per request a random boolean ``[qo_len, kv_len]`` matrix (density drawn,
  rows without any key included), packed as ``CustomMask.bits``.

EXTENDING: a new family is one more ``draw`` in ``extend`` behind its own ``Capabilities`` flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
from hypothesis import strategies as st
from pa_oracle.backends.base import Capabilities
from pa_oracle.fuzz.draw import built
from pa_oracle.oracle.case import Case, CustomMask, Heads, Layout, Options, Rope, tree_positions

MLA_DIMS = ((12, 8), (576, 512), (192, 128), (24, 16), (80, 64))  # (head_dim_qk, head_dim_vo): shrinks to small
MAX_TREE_DEPTH, MAX_TREE_WIDTH, MAX_TREE_NODES = 8, 4, 16
MASK_DENSITIES = (0.5, 0.1, 0.9, 0.0, 1.0)


@st.composite
def tree_parents(draw: st.DrawFn, max_depth: int = MAX_TREE_DEPTH, max_width: int = MAX_TREE_WIDTH,
                 max_nodes: int = MAX_TREE_NODES) -> tuple[int, ...]:
    """One draft tree, nodes in breadth-first order: ``parents[i]`` is -1 (a root, which follows
    the prefix) or an earlier node. Each node has 0..``max_width`` children; a chain (width 1) is
    the causal mask."""
    depth = draw(built.integers(1, max_depth), label="tree depth")
    width = draw(built.integers(1, max_width), label="tree width")
    parents: list[int] = []
    frontier = [-1]
    for _ in range(depth):
        level: list[int] = []
        for parent in frontier:
            for _ in range(draw(built.integers(1 if parent == frontier[0] else 0, width), label="children")):
                if len(parents) == max_nodes:
                    break
                level.append(len(parents))
                parents.append(parent)
        if not level:
            break
        frontier = level
    return tuple(parents)


def mla_dims(caps: Capabilities) -> list[tuple[int, int]]:
    """The (head_dim_qk, head_dim_vo) pairs an MLA case of ``caps`` is drawn with: the built-in ones it declares (in
    ``MLA_DIMS``' order), then every other pair it declares (in its order); all built-in ones when it declares none."""
    if caps.mla_dims is None:
        return list(MLA_DIMS)
    declared = [(int(d[0]), int(d[1])) for d in caps.mla_dims]
    return [d for d in MLA_DIMS if d in declared] + [d for d in declared if d not in MLA_DIMS]


def _mla_heads(draw: st.DrawFn, case: Case, caps: Capabilities, pinned: Mapping[str, Any]) -> Heads:
    dims = [(qk, vo) for qk, vo in mla_dims(caps) if pinned.get("head_dim_qk", qk) == qk and pinned.get("head_dim_vo", vo) == vo]
    qk, vo = draw(built.sampled_from(dims), label="mla dims")
    return Heads(case.heads.num_qo_heads, 1, qk, vo, mla=True)


def _mla_rope(draw: st.DrawFn, rope: Rope, d_kpe: int, caps: Capabilities) -> Rope:
    """``rope`` on an MLA case, whose ``rotary_dim`` counts within the ``d_kpe`` rope dims: the whole of them when
    ``rope`` rotates its whole head, else a partial ``rotary_dim`` drawn as ``strategies`` draws one for a head."""
    if rope.rotary_dim is None or not caps.rope_partial:
        return dataclasses.replace(rope, rotary_dim=None)
    partial = sorted({d for d in range(2, d_kpe, 2) if d in (d_kpe // 2, d_kpe // 4, 2) or d == d_kpe - 2}, reverse=True)
    rotary_dim = draw(built.sampled_from(partial), label="mla rotary_dim") if partial else None
    return dataclasses.replace(rope, rotary_dim=rotary_dim)


def _tree_case(draw: st.DrawFn, case: Case, caps: Capabilities, max_prefix: int) -> Case:
    """``case``'s requests replaced by draft trees behind prefixes (same batch size and pages size)."""
    lay = case.layout
    trees = [draw(tree_parents(), label=f"tree[{b}]") for b in range(lay.batch_size)]
    prefixes = [draw(built.integers(0, max_prefix), label=f"prefix[{b}]") for b in range(lay.batch_size)]
    kv_lens = [p + len(t) for p, t in zip(prefixes, trees)]
    needed = sum(-(-n // lay.page_size) for n in kv_lens)
    order = draw(built.permutations(range(needed)), label="page_order")
    layout = Layout.from_lengths([len(t) for t in trees], kv_lens, lay.page_size, page_order=order)
    positions = tree_positions(layout, tuple(trees)) if caps.rope_positions and case.options.rope is not None else None
    return case.replace(layout=layout, custom_mask=CustomMask(tree_parents=tuple(trees)), positions=positions)


def _arbitrary_mask(draw: st.DrawFn, case: Case) -> CustomMask:
    lay = case.layout
    rng = np.random.default_rng(draw(built.integers(0, 2**32 - 1), label="mask seed"))
    masks = []
    for b, (qo, kv) in enumerate(zip(lay.qo_lens, lay.kv_lens)):
        density = draw(built.sampled_from(MASK_DENSITIES), label=f"mask density[{b}]")
        masks.append(rng.random((qo, kv)) < density)
    return CustomMask.from_dense(masks)


@st.composite
def extend(
    draw: st.DrawFn, case: Case, caps: Capabilities, max_prefix: int = 64, pinned: Mapping[str, Any] = {}
) -> Case:
    """``case`` made MLA and/or masked as ``caps`` admits (module docstring); inside a compile key's
    ``pinned`` values (its ``mla`` and head dims) when the campaign draws inside one."""
    mla = pinned["mla"] if "mla" in pinned else True in caps.mla and (False not in caps.mla or draw(built.booleans(), label="mla"))
    if mla:
        heads = _mla_heads(draw, case, caps, pinned)
        rope = case.options.rope
        if rope is not None:  # drawn only for a kernel declaring rope: no other kernel's seeds change
            rope = _mla_rope(draw, rope, heads.d_kpe, caps)
        case = case.replace(heads=heads, options=dataclasses.replace(case.options, rope=rope))
        if case.options.is_fp8:  # one latent cache holds V too: one scale
            case = case.replace(options=_same_scale(case))
    if True in caps.custom_mask and (False not in caps.custom_mask or draw(built.booleans(), label="custom mask")):
        kind = draw(built.sampled_from(("tree", "arbitrary")), label="mask kind")
        if kind == "tree":
            case = _tree_case(draw, case, caps, max_prefix)
        else:
            case = case.replace(custom_mask=_arbitrary_mask(draw, case))
    return case


def _same_scale(case: Case) -> Options:
    return dataclasses.replace(case.options, v_scale=case.options.k_scale)
