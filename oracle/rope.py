"""Rotary position embedding, in float64, by absolute position (``pa_oracle.oracle.case.Rope``).

Query ``i`` of a request with ``qo_len`` queries and ``kv_len`` keys sits at ``kv_len - qo_len + i``
and key ``j`` at ``j``: the positions FlashInfer's in-kernel RoPE uses (``vec_apply_llama_rope`` in
``include/flashinfer/attention/decode.cuh`` rotates q at ``kv_len - 1`` and key ``j`` at ``j``;
``q_smem_inplace_apply_rotary`` in ``prefill.cuh`` rotates q at ``i + kv_len - qo_len``). A case with
explicit ``positions`` (``Case.positions``: EAGLE's ``prefix + depth`` of a draft tree) rotates query ``i``
at its position, and the request's last ``qo_len`` keys, its queries' own, at their queries' positions.

An MLA case (DeepSeek's split, ``Heads.mla``) rotates only the rope part of each row, ``q_pe`` and ``kpe``
(``Rope.span``: from ``d_ckv`` on, the frequencies over its ``dims(d_kpe)`` dims); ``q_nope`` and the latent
``ckv``, which is also V, are never rotated.

``kernel_rotated`` rotates as a correct float32 RoPE kernel does, for the tolerance model's RoPE controls
(``pa_oracle.oracle.tolerance``): float32 angles, float32 rotation, the result stored in the input dtype
(or kept in float32).

>>> import torch
>>> from pa_oracle.oracle.case import Rope
>>> x = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
>>> rotate(x, torch.tensor([1.0], dtype=torch.float64), Rope(theta=1e4)).tolist()  # angle 1 rad
[[0.5403023058681398, 0.8414709848078965]]
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from pa_oracle.oracle.case import Case, Rope
from pa_oracle.oracle.tensors import Tensors, token_addresses


def inverse_frequencies(rope: Rope, head_dim: int, like: torch.Tensor) -> torch.Tensor:
    """``theta ** (-2 i / rotary_dim)`` for each rotated pair ``i`` (float64, on ``like``'s device)."""
    dims = rope.dims(head_dim)
    i = torch.arange(dims // 2, dtype=torch.float64, device=like.device)
    return torch.pow(torch.tensor(float(rope.theta), dtype=torch.float64, device=like.device), -2.0 * i / max(dims, 1))


def rotate(x: torch.Tensor, positions: torch.Tensor, rope: Rope) -> torch.Tensor:
    """``x`` [N, ..., D] (float64) rotated by ``positions`` [N] (float64); a new tensor."""
    dims = rope.dims(x.shape[-1])
    angle = (positions / float(rope.scale))[:, None] * inverse_frequencies(rope, x.shape[-1], x)  # [N, dims / 2]
    return _rotate_pairs(x, angle, rope.style, dims)


def _rotate_pairs(x: torch.Tensor, angle: torch.Tensor, style: str, dims: int) -> torch.Tensor:
    """``x``'s first ``dims`` dims rotated pairwise by ``angle`` [N, dims / 2] (in ``x``'s dtype; the rest
    copied): neox pairs (i, i + dims / 2), else interleaved pairs (2i, 2i + 1)."""
    angle = angle.view(angle.shape[0], *[1] * (x.dim() - 2), angle.shape[-1])
    cos, sin = torch.cos(angle), torch.sin(angle)
    out = x.clone()
    first, second = (slice(0, dims // 2), slice(dims // 2, dims)) if style == "neox" else (slice(0, dims, 2), slice(1, dims, 2))
    a, b = x[..., first], x[..., second]
    out[..., first], out[..., second] = a * cos - b * sin, b * cos + a * sin
    return out


def _in_span(rotate_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, case: Case) -> torch.Tensor:
    """``x`` [N, ..., head_dim_qk] with ``rotate_fn`` applied to the dims of ``case``'s ``Rope.span`` alone (its
    dtype the result's); the other dims converted to that dtype unchanged. A new tensor."""
    rope = case.options.rope
    assert rope is not None, "a RoPE case"
    start, stop = rope.span(case.heads)
    if (start, stop) == (0, x.shape[-1]) or not case.heads.mla:
        return rotate_fn(x)  # the rotary_dim of a normal head counts from dim 0 (``rotate``)
    part = rotate_fn(x[..., start:])  # rotary_dim counts within q_pe / kpe
    return torch.cat([x[..., :start].to(part.dtype), part], dim=-1)


def _rotate32(x: torch.Tensor, positions: torch.Tensor, rope: Rope, store: torch.dtype) -> torch.Tensor:
    """``x`` [N, ..., D] rotated by integer ``positions`` [N] in float32 as FlashInfer does, stored in ``store``.

    ``compute_rope_freq`` (``attention/prefill.cuh``): ``rope_rcp_scale * __powf(rope_rcp_theta, 2 i / dims)``
    in float32; ``q_frag_apply_llama_rope`` / ``k_frag_apply_llama_rope``: ``__sincosf(float(p) * freq)`` and
    ``a * cos - b * sin``, ``b * cos + a * sin`` in float32 from the stored values, assigned back to the
    fragment's dtype (round to nearest). The angle ``float(p) * freq`` errs by up to ~``p * freq * 2^-23``."""
    dims = rope.dims(x.shape[-1])
    f32, device = torch.float32, x.device
    pair = torch.arange(dims // 2, dtype=f32, device=device)
    rcp_scale = torch.tensor(1.0 / float(rope.scale), dtype=f32, device=device)
    rcp_theta = torch.tensor(1.0 / float(rope.theta), dtype=f32, device=device)
    freq = rcp_scale * torch.pow(rcp_theta, 2 * pair / max(dims, 1))
    angle = positions.to(torch.float32)[:, None] * freq  # [N, dims / 2], each product rounded to float32
    return _rotate_pairs(x.to(torch.float32), angle, rope.style, dims).to(store)


def operand_dtype(stored: torch.dtype, store: bool = True) -> torch.dtype:
    """Where a RoPE kernel keeps a rotated operand: with ``store``, back in its 16-bit or 32-bit input dtype
    (FlashInfer's fa2 prefill, ``{q,k}_smem_inplace_apply_rotary``), never in fp8 (``k_smem_inplace_apply_rotary``
    asserts a 16-bit K; CUDA-core decode rotates an fp8 key after ``cast_load`` in float32 registers): float32
    then; without ``store``, in float32 (FlashInfer's decode, ``vec_apply_llama_rope``)."""
    return torch.float32 if stored.itemsize < 2 or not store else stored


def query_positions(case: Case) -> np.ndarray:
    """RoPE position of every query row: ``case.positions``, else bottom-right aligned (negative where
    qo_len > kv_len)."""
    lay = case.layout
    if case.positions is not None:
        return np.fromiter((p for request in case.positions for p in request), dtype=np.int64, count=lay.total_q)
    qo, kv = np.asarray(lay.qo_lens, dtype=np.int64), np.asarray(lay.kv_lens, dtype=np.int64)
    starts = np.repeat(np.cumsum(qo) - qo, qo)
    return np.arange(lay.total_q, dtype=np.int64) - starts + np.repeat(kv - qo, qo)


def key_positions(case: Case) -> np.ndarray:
    """RoPE position of every key token, in ``token_addresses`` order (request-major): ``0..kv_len-1``, but
    with ``case.positions`` the last ``qo_len`` keys of a request (its queries' own) at their queries' positions."""
    kv = np.asarray(case.layout.kv_lens, dtype=np.int64)
    positions = np.arange(int(kv.sum()), dtype=np.int64) - np.repeat(np.cumsum(kv) - kv, kv)
    if case.positions is not None:
        start = 0
        for request, kv_len in zip(case.positions, case.layout.kv_lens):
            own = request[max(len(request) - kv_len, 0):]  # a query before the first key has no key of its own
            positions[start + kv_len - len(own) : start + kv_len] = own
            start += kv_len
    return positions


def rotated(case: Case, tensors: Tensors) -> Tensors:
    """The case's tensors with q and every referenced key slot rotated (float64 copies; a slot no
    request references keeps its poison; V is unchanged). fp8 keys rotate as stored: rotation is
    linear, so scaling by ``k_scale`` afterwards gives the same values. Without rope: ``tensors``."""
    rope = case.options.rope
    if rope is None:
        return tensors
    device = tensors.q.device
    as_tensor = lambda a: torch.from_numpy(a).to(device=device, dtype=torch.float64)  # noqa: E731
    q_pos, k_pos = as_tensor(query_positions(case)), as_tensor(key_positions(case))
    q = _in_span(lambda x: rotate(x, q_pos, rope), tensors.q.to(torch.float64), case)
    k_cache = tensors.k_cache.to(torch.float64, copy=True)  # never the caller's (nor MLA's V) memory
    pages, slots = (t.to(device) for t in token_addresses(case))
    if len(pages):
        k_cache[pages, slots] = _in_span(lambda x: rotate(x, k_pos, rope), k_cache[pages, slots], case)
    return Tensors(q, k_cache, tensors.v_cache)


def kernel_rotated(case: Case, tensors: Tensors, store: bool = True) -> Tensors:
    """The case's tensors with q and every referenced key slot rotated as a correct float32 RoPE kernel
    rotates them (``_rotate32``: float32 angles and arithmetic) and kept where it keeps them
    (``operand_dtype(dtype, store)``); V unchanged. fp8 values rotate as stored (the scales multiply after,
    as in ``rotated``). The case must have a rope."""
    rope = case.options.rope
    assert rope is not None, "kernel_rotated needs a RoPE case"
    device = tensors.q.device
    as_tensor = lambda a: torch.from_numpy(a).to(device=device)  # noqa: E731
    q_pos, k_pos = as_tensor(query_positions(case)), as_tensor(key_positions(case))
    q_store = operand_dtype(tensors.q.dtype, store)
    q = _in_span(lambda x: _rotate32(x, q_pos, rope, q_store), tensors.q, case).to(q_store)
    k_cache = tensors.k_cache.to(operand_dtype(tensors.k_cache.dtype, store))  # a copy when the dtype changes
    if k_cache is tensors.k_cache:
        k_cache = k_cache.clone()
    pages, slots = (t.to(device) for t in token_addresses(case))
    if len(pages):
        k_cache[pages, slots] = _in_span(lambda x: _rotate32(x, k_pos, rope, k_cache.dtype), tensors.k_cache[pages, slots], case)
    return Tensors(q, k_cache, tensors.v_cache)
