"""The float64 reference as one fused Triton kernel on CUDA: the same result as
``oracle.reference.reference`` up to float64 rounding, without materializing the logits.

The kernel (``oracle._fused_kernel``) reads the paged pool directly through the page table,
converts K and V to float64 in registers and runs an online softmax in float64 (libdevice
exp/log/tanh: ``tl.exp`` on float64 is only float32-accurate). A tile packs one request's
(query, head-in-group) rows for one kv head, so each kv head's keys are read once per tile;
decode rows (qo_len 1) fill ``group_size`` rows of a 16-row tile. The host plans every tile and
uploads the plan in one asynchronous copy: no stream syncs.

>>> from oracle.case import Case, Layout, Heads
>>> from oracle.tensors import make_tensors
>>> case = Case(Layout.from_lengths([1], [3], page_size=2), Heads(1, 1, 4, 4))
>>> fused_reference(case, make_tensors(case)) is None  # CPU tensors: the caller uses ``reference``
True
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from oracle.case import Case, CaseError
from oracle.reference import LOG2_E, Reference
from oracle.tensors import Tensors

MAX_HEAD_DIM = 256  # a 256-wide float64 row already costs 2 KiB of registers per tile row
_MIN_DOT = 16  # tl.dot needs every tile dimension >= 16
_MAX_ACC_ELEMENTS = 128 * 128  # float64 accumulator [BLOCK_M, BLOCK_DVO] per program: 128 KiB
_SMALL_BLOCK_MS = (16, 32, 64)  # tiles for requests with few packed rows (decode, speculative)


@dataclass(frozen=True)
class FusedConfig:
    """Tile sizes and launch shape. ``block_m`` is the tile height of requests with more than 64
    packed rows (shrunk for wide heads); requests with fewer use the smallest of 16/32/64 rows
    that holds them, launched with ``small_num_warps``."""

    block_m: int = 128
    block_n: int = 32
    num_warps: int = 8
    num_stages: int = 1
    small_num_warps: int = 4

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value < _MIN_DOT or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= {_MIN_DOT}, got {value}")
        for name in ("num_warps", "small_num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {self.num_stages}")


DEFAULT_CONFIG = FusedConfig()


def unsupported_reason(case: Case) -> str | None:
    """Why the fused kernel does not take ``case`` (None: it does). Every option of
    ``oracle.case`` is supported; head dims are padded to a power of two >= 16, up to 256."""
    heads = case.heads
    if max(heads.head_dim_qk, heads.head_dim_vo) > MAX_HEAD_DIM:
        return f"head dim {max(heads.head_dim_qk, heads.head_dim_vo)} > {MAX_HEAD_DIM}"
    return None


def fused_reference(
    case: Case, tensors: Tensors, *, lse_base: str = "e", config: FusedConfig = DEFAULT_CONFIG
) -> Reference | None:
    """``reference(case, tensors, lse_base=lse_base)`` computed by the fused float64 kernel, or None
    where it does not apply: tensors not on CUDA, Triton not installed, a head dim above 256, or an
    e4m3 fp8 cache on a GPU below sm_89 (Triton converts e4m3 from sm_89 on). The result is
    deterministic and a row's value does not depend on the other requests of the batch (nor on
    their order): each tile attends one request's rows alone, in a fixed order of key blocks.
    ``logit_noise`` is not computed (None)."""
    _check_lse_base(lse_base)
    if tensors.q.device.type != "cuda" or unsupported_reason(case) is not None:
        return None
    try:
        from oracle import _fused_kernel  # noqa: F401
    except ImportError:
        return None
    if case.options.kv_dtype == "float8_e4m3fn" and torch.cuda.get_device_capability(tensors.q.device) < (8, 9):
        return None
    return fused_attention(case, tensors, lse_base=lse_base, config=config)


class _Plan(NamedTuple):
    """Host-built inputs of the launches: ``ints`` holds every launch's tile table then the page
    table (``kv_indices``), ``floats`` the float64 parameters; ``launches`` is (block_m, first
    tile, tile count) per launch."""

    ints: torch.Tensor
    floats: torch.Tensor
    launches: tuple[tuple[int, int, int], ...]
    pages_offset: int


def fused_attention(
    case: Case, tensors: Tensors, *, lse_base: str = "e", config: FusedConfig = DEFAULT_CONFIG
) -> Reference:
    """The fused kernel on CUDA tensors, or on CPU tensors under Triton's interpreter
    (``TRITON_INTERPRET=1``; a test entry point). Raises ``CaseError`` for a case that
    ``unsupported_reason`` rejects and ``ImportError`` without Triton."""
    from oracle import _fused_kernel as fk

    _check_lse_base(lse_base)
    reason = unsupported_reason(case)
    if reason is not None:
        raise CaseError(f"the fused oracle does not support this case: {reason}")
    interpret = fk.interpreting()
    device = tensors.q.device
    if device.type != "cuda" and not interpret:
        raise ValueError(f"the fused oracle runs on CUDA tensors (or under TRITON_INTERPRET=1), got {device}")
    for name, t in tensors.as_dict().items():
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, q on {device}")

    heads, opts = case.heads, case.options
    q, k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (tensors.q, tensors.k_cache, tensors.v_cache))
    out = torch.empty(case.layout.total_q, heads.num_qo_heads, heads.head_dim_vo, dtype=torch.float64, device=device)
    lse = torch.empty(out.shape[:2], dtype=torch.float64, device=device)
    block_dqk, block_dvo = (max(_MIN_DOT, 1 << (d - 1).bit_length()) for d in (heads.head_dim_qk, heads.head_dim_vo))
    plan = _plan(case, _block_ms(config, block_dvo), lse_base)
    ints, floats = _upload(plan.ints, device), _upload(plan.floats, device)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        for block_m, first_tile, tiles in plan.launches:
            fk.attention[(tiles * heads.num_kv_heads,)](
                q, k_cache, v_cache, out, lse,
                ints[first_tile * fk.TILE_FIELDS.value :], ints[plan.pages_offset :], floats,
                q.stride(0), q.stride(1),
                k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                out.stride(0), out.stride(1), lse.stride(0),
                heads.num_kv_heads, heads.num_qo_heads, case.layout.page_size, opts.window_left,
                GROUP=heads.group_size, HEAD_DIM_QK=heads.head_dim_qk, HEAD_DIM_VO=heads.head_dim_vo,
                BLOCK_DQK=block_dqk, BLOCK_DVO=block_dvo, BLOCK_M=block_m, BLOCK_N=config.block_n,
                CAUSAL=opts.causal, HAS_WINDOW=opts.window_left >= 0, HAS_CAP=opts.logits_soft_cap > 0,
                HAS_ALIBI=opts.alibi_slopes is not None, HAS_SINKS=opts.sinks is not None,
                COMPILED=not interpret,
                num_warps=config.num_warps if block_m > _SMALL_BLOCK_MS[-1] else config.small_num_warps,
                num_stages=config.num_stages,
            )  # fmt: skip
    return Reference(out, lse, None)


def _block_ms(config: FusedConfig, block_dvo: int) -> tuple[int, ...]:
    """The tile heights, ascending: the small ones, then the configured one (capped so that the
    float64 accumulator stays at most 128 x 128)."""
    big = max(_MIN_DOT, min(config.block_m, _MAX_ACC_ELEMENTS // block_dvo))
    return tuple(sorted({m for m in _SMALL_BLOCK_MS if m < big} | {big}))


def _plan(case: Case, block_ms: tuple[int, ...], lse_base: str) -> _Plan:
    """Every tile of every request, one launch per tile height. A request's packed rows
    (``qo_len * group_size``, query-major) go to the smallest tile height that holds them, else
    to tiles of the largest; within a launch the tiles of longer contexts come first, so the
    long programs start early."""
    from oracle._fused_kernel import PARAMS, TILE_FIELDS

    layout, heads, opts = case.layout, case.heads, case.options
    qo_indptr = np.asarray(layout.qo_indptr, dtype=np.int64)
    kv_lens = np.asarray(layout.kv_lens, dtype=np.int64)
    rows = np.diff(qo_indptr) * heads.group_size
    fits = np.searchsorted(np.asarray(block_ms), rows)  # the first height >= rows
    height = np.asarray(block_ms)[np.minimum(fits, len(block_ms) - 1)]
    tables, launches, first = [], [], 0
    for block_m in block_ms[::-1]:
        requests = np.flatnonzero((height == block_m) & (rows > 0))
        requests = requests[np.argsort(-kv_lens[requests], kind="stable")]
        counts = -(-rows[requests] // block_m)
        if counts.sum() == 0:
            continue
        request = np.repeat(requests, counts)
        tile_in_request = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        table = np.stack(
            [
                qo_indptr[request],
                qo_indptr[request + 1] - qo_indptr[request],
                kv_lens[request],
                np.asarray(layout.kv_indptr, dtype=np.int64)[request],
                tile_in_request * block_m,
            ],
            axis=1,
        )
        tables.append(table.reshape(-1))
        launches.append((block_m, first, len(table)))
        first += len(table)
    pages = np.asarray(layout.kv_indices, dtype=np.int64)
    ints = np.concatenate([*tables, pages, np.zeros(1, dtype=np.int64)])  # never empty
    q_scale = case.sm_scale * (opts.k_scale if opts.is_fp8 else 1.0)
    v_scale = opts.v_scale if opts.is_fp8 else 1.0
    floats = [q_scale, v_scale, opts.logits_soft_cap, LOG2_E if lse_base == "2" else 1.0]
    assert len(floats) == PARAMS.value
    zeros = (0.0,) * heads.num_qo_heads
    floats += [*(opts.alibi_slopes or zeros), *(opts.sinks or zeros)]
    return _Plan(torch.from_numpy(ints), torch.tensor(floats, dtype=torch.float64), tuple(launches), first * TILE_FIELDS.value)


def _upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without a stream sync (pinned, asynchronous copy)."""
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _check_lse_base(lse_base: str) -> None:
    if lse_base not in ("e", "2"):
        raise ValueError(f"lse_base must be 'e' or '2', got {lse_base!r}")


__all__ = ["DEFAULT_CONFIG", "FusedConfig", "fused_attention", "fused_reference", "unsupported_reason"]
