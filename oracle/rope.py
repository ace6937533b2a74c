"""Rotary position embedding, in float64, by absolute position (``pa_oracle.oracle.case.Rope``), and
the rounding a kernel that rotates in float32 may add to the rotated operands (``operand_rounding``).

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

import math
from typing import NamedTuple

import numpy as np
import torch
from pa_oracle.oracle.case import Case, Rope
from pa_oracle.oracle.tensors import Tensors, token_addresses, torch_dtype


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


# How far a float32 RoPE angle may be from (p / scale) * theta ** (-2 i / d), in radians:
# ANGLE_RELATIVE * |angle| + ANGLE_POSITION * |p| / scale + ANGLE_ABSOLUTE. It covers FlashInfer's in-kernel
# RoPE (include/flashinfer/attention/prefill.cuh: ``compute_rope_freq`` takes the frequency from the fast
# ``__powf(rope_rcp_theta, 2 i / d)``, ``q_frag_apply_llama_rope`` / ``k_frag_apply_llama_rope`` the sine and
# cosine from ``__sincosf(float(pos) * freq)``; decode.cuh and pos_enc.cuh do the same) and vLLM's float32 cache
# (``inv_freq`` and ``t * inv_freq`` in float32), from the CUDA guide's intrinsic errors:
# * |angle| terms: the float32 product p * freq (2^-24), ``__powf``'s exp2 (2 ulp: 2^-22) and ``__sincosf``'s
#   argument reduction by a float32 1 / (2 pi) (rounded toward zero, about 1.5 * 2^-23): 1.9 * 2^-22 in all;
# * ``__powf``'s log2 (2 ulp of |log2 x|, x = 1 / theta) moves y log2 x by <= y |log2 x| 2^-22, so the angle by
#   p x^y y ln(1 / x) 2^-22 <= p 2^-22 / e (the max over y): |p| terms, 2^-23.44;
# * ``__sincosf`` on the reduced argument: 2^-21.41 absolute.
ANGLE_RELATIVE = 2.0**-21
ANGLE_POSITION = 2.0**-23
ANGLE_ABSOLUTE = 2.0**-21
# float32 arithmetic of the rotation itself: two products and a sum, 2 * 2^-24 of |a cos| + |b sin|
ROTATION_ARITHMETIC = 2.0**-23


class Operand(NamedTuple):
    """One rotated operand as a kernel may hold it, in logical token order, float64, in value units (times
    its fp8 scale). ``exact``: the float64 rotation. Kept in float32, the kernel's value is within
    ``eps`` of it (its float32 angle and arithmetic); stored back in its input dtype, it is within
    ``half`` of ``exact + mid`` (round-to-nearest is monotone: a value within ``eps`` rounds to one
    between the roundings of ``exact - eps`` and ``exact + eps``, whose midpoint is ``exact + mid``)."""

    exact: torch.Tensor
    eps: torch.Tensor
    mid: torch.Tensor
    half: torch.Tensor


def angle_error(positions: torch.Tensor, angle: torch.Tensor, rope: Rope) -> torch.Tensor:
    """The bound on a float32 angle's error (radians) at ``positions`` [N] for the exact ``angle`` [N, pairs]."""
    return ANGLE_RELATIVE * angle.abs() + (ANGLE_POSITION * positions.abs() / float(rope.scale))[:, None] + ANGLE_ABSOLUTE


def _operand(x: torch.Tensor, positions: torch.Tensor, rope: Rope, dtype: torch.dtype, scale: float) -> Operand:
    """``x`` [N, H, D] (stored values, float64) rotated by ``positions`` [N], with its rounding model."""
    exact = rotate(x, positions, rope)
    dims = rope.dims(x.shape[-1])
    angle = (positions / float(rope.scale))[:, None] * inverse_frequencies(rope, x.shape[-1], x)  # [N, dims / 2]
    if rope.style == "neox":
        a, b = x[..., : dims // 2], x[..., dims // 2 : dims]
    else:
        a, b = x[..., 0:dims:2], x[..., 1:dims:2]
    # |a' - a_exact| <= |a| |cos' - cos| + |b| |sin' - sin| + arithmetic <= sqrt(2) r (angle error + arithmetic)
    pair = math.sqrt(2.0) * torch.sqrt(a * a + b * b) * (angle_error(positions, angle, rope)[:, None, :] + ROTATION_ARITHMETIC)
    eps = torch.zeros_like(x)
    if rope.style == "neox":
        eps[..., : dims // 2], eps[..., dims // 2 : dims] = pair, pair
    else:
        eps[..., 0:dims:2], eps[..., 1:dims:2] = pair, pair
    below = (exact - eps).to(dtype).to(torch.float64)
    above = (exact + eps).to(dtype).to(torch.float64)
    return Operand(exact * scale, eps * scale, ((below + above) / 2 - exact) * scale, (above - below) / 2 * scale)


def operand_rounding(case: Case, tensors: Tensors) -> tuple[Operand, Operand] | None:
    """(q [total_q, Hq, Dqk], keys [total_kv, Hkv, Dqk]) as a kernel that rotates them in float32 may hold
    them: rotated with a float32 angle and arithmetic (``angle_error``), then kept in float32 or stored back
    in the input dtype before the dot products. FlashInfer does the latter (``q_smem_inplace_apply_rotary``
    and ``k_smem_inplace_apply_rotary`` in include/flashinfer/attention/prefill.cuh load a fragment with
    ``ldmatrix``, rotate it in float32 with ``q_frag_apply_llama_rope`` / ``k_frag_apply_llama_rope``, whose
    assignments convert back to ``DTypeQ`` / ``DTypeKV``, and ``stmatrix`` it back to shared memory for the
    MMA); its CUDA-core decode (``vec_apply_llama_rope`` in decode.cuh) keeps float32. An fp8 key (under a
    16-bit q) is stored in the 16-bit dtype: rounding a rotation to fp8 is a finding (golden/README.md, "Rounding
    to fp8"). None without rope."""
    rope = case.options.rope
    if rope is None:
        return None
    opts = case.options
    device = tensors.q.device
    as_tensor = lambda a: torch.from_numpy(a).to(device=device, dtype=torch.float64)  # noqa: E731
    q = _operand(tensors.q.to(torch.float64), as_tensor(query_positions(case)), rope, torch_dtype(opts.q_dtype),
                 opts.q_scale if opts.q_is_fp8 else 1.0)
    pages, slots = (t.to(device) for t in token_addresses(case))
    stored = tensors.k_cache[pages, slots].to(torch.float64)
    # an fp8 key is rotated after dequantizing: a kernel stores the rotation in its 16-bit MMA dtype, not in fp8
    k_dtype = torch_dtype(opts.out_dtype if opts.is_fp8 and not opts.q_is_fp8 else opts.kv_dtype)
    k = _operand(stored, as_tensor(key_positions(case)), rope, k_dtype, opts.k_scale if opts.is_fp8 else 1.0)
    return q, k
