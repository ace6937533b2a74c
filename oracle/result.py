"""What the oracle returns, shared by its engines (``pa_oracle.oracle.reference``'s torch code and
``pa_oracle.oracle.fused``'s Triton kernel)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

LOG2_E = 1.0 / math.log(2.0)


class Reference(NamedTuple):
    out: torch.Tensor  # [total_q, Hq, Dvo] float64
    lse: torch.Tensor  # [total_q, Hq] float64
    logit_noise: torch.Tensor | None  # [total_q, Hq, Dvo]: see ``reference``
    engine: str = "torch"  # which code computed it: "torch" (this module) or "fused" (pa_oracle.oracle.fused)
    rope_control: RopeControl | None = None  # a RoPE case with ``logit_noise``: ``reference.rope_control``; else None


class RopeControl(NamedTuple):
    """The tolerance model's RoPE controls of a case (``pa_oracle.oracle.tolerance``): its float64 attention
    of q and k rotated as a correct float32 RoPE kernel rotates them (float32 angles and arithmetic),
    ``out``/``lse`` stored back in the input dtype, ``angle_out``/``angle_lse`` kept in float32."""

    out: torch.Tensor
    lse: torch.Tensor
    angle_out: torch.Tensor
    angle_lse: torch.Tensor
