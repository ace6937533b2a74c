"""Rotary position embedding, in float64, by absolute position (``pa_oracle.oracle.case.Rope``).

Query ``i`` of a request with ``qo_len`` queries and ``kv_len`` keys sits at ``kv_len - qo_len + i``
and key ``j`` at ``j``: the positions FlashInfer's in-kernel RoPE uses (``vec_apply_llama_rope`` in
``include/flashinfer/attention/decode.cuh`` rotates q at ``kv_len - 1`` and key ``j`` at ``j``;
``q_smem_inplace_apply_rotary`` in ``prefill.cuh`` rotates q at ``i + kv_len - qo_len``).

>>> import torch
>>> from pa_oracle.oracle.case import Rope
>>> x = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
>>> rotate(x, torch.tensor([1.0], dtype=torch.float64), Rope(theta=1e4)).tolist()  # angle 1 rad
[[0.5403023058681398, 0.8414709848078965]]
"""

from __future__ import annotations

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
    angle = angle.view(angle.shape[0], *[1] * (x.dim() - 2), angle.shape[-1])
    cos, sin = torch.cos(angle), torch.sin(angle)
    out = x.clone()
    if rope.style == "neox":
        a, b = x[..., : dims // 2], x[..., dims // 2 : dims]
        out[..., : dims // 2], out[..., dims // 2 : dims] = a * cos - b * sin, b * cos + a * sin
    else:
        a, b = x[..., 0:dims:2], x[..., 1:dims:2]
        out[..., 0:dims:2], out[..., 1:dims:2] = a * cos - b * sin, b * cos + a * sin
    return out


def query_positions(case: Case) -> np.ndarray:
    """Absolute position of every query row (bottom-right aligned; negative where qo_len > kv_len)."""
    lay = case.layout
    qo, kv = np.asarray(lay.qo_lens, dtype=np.int64), np.asarray(lay.kv_lens, dtype=np.int64)
    starts = np.repeat(np.cumsum(qo) - qo, qo)
    return np.arange(lay.total_q, dtype=np.int64) - starts + np.repeat(kv - qo, qo)


def key_positions(case: Case) -> np.ndarray:
    """Position of every key token, in ``token_addresses`` order (request-major): 0..kv_len-1."""
    kv = np.asarray(case.layout.kv_lens, dtype=np.int64)
    return np.arange(int(kv.sum()), dtype=np.int64) - np.repeat(np.cumsum(kv) - kv, kv)


def rotated(case: Case, tensors: Tensors) -> Tensors:
    """The case's tensors with q and every referenced key slot rotated (float64 copies; a slot no
    request references keeps its poison; V is unchanged). fp8 keys rotate as stored: rotation is
    linear, so scaling by ``k_scale`` afterwards gives the same values. Without rope: ``tensors``."""
    rope = case.options.rope
    if rope is None:
        return tensors
    device = tensors.q.device
    as_tensor = lambda a: torch.from_numpy(a).to(device=device, dtype=torch.float64)  # noqa: E731
    q = rotate(tensors.q.to(torch.float64), as_tensor(query_positions(case)), rope)
    k_cache = tensors.k_cache.to(torch.float64)
    pages, slots = (t.to(device) for t in token_addresses(case))
    if len(pages):
        k_cache[pages, slots] = rotate(k_cache[pages, slots], as_tensor(key_positions(case)), rope)
    return Tensors(q, k_cache, tensors.v_cache)
