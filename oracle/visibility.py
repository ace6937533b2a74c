"""Which keys each query row attends, as the oracle defines it (``pa_oracle.oracle.case``): bottom-right
aligned causal and window tests, then the case's custom mask."""

from __future__ import annotations

import numpy as np
from pa_oracle.oracle.case import Case


def visible_keys(case: Case) -> list[np.ndarray]:
    """Per request the boolean ``[qo_len, kv_len]`` keys the case attends without its custom mask
    (causal and window, bottom-right aligned: query ``i`` sits at ``kv_len - qo_len + i``)."""
    opts = case.options
    out = []
    for qo, kv in zip(case.layout.qo_lens, case.layout.kv_lens):
        q_pos = np.arange(kv - qo, kv)[:, None]
        k_pos = np.arange(kv)[None, :]
        keep = np.ones((qo, kv), dtype=bool)
        if opts.causal:
            keep &= k_pos <= q_pos
        if opts.window_left >= 0:
            keep &= k_pos >= q_pos - opts.window_left
        out.append(keep)
    return out


def attended(case: Case) -> list[np.ndarray]:
    """What the case's attention sees: its visible keys, AND its mask where it has one."""
    masks = case.masks()
    visible = visible_keys(case)
    return visible if masks is None else [v & m for v, m in zip(visible, masks)]
