"""The float64 reference as one fused Triton kernel on CUDA: the same result as
``pa_oracle.oracle.reference.reference`` up to float64 rounding, without materializing the logits.

The kernel (``pa_oracle.oracle._fused_kernel``) reads the paged pool directly through the page table,
converts K and V to float64 in registers and runs an online softmax in float64 (libdevice
exp/log/tanh: ``tl.exp`` on float64 is only float32-accurate). A tile packs one request's
(query, head-in-group) rows for one kv head, so each kv head's keys are read once per tile;
decode rows (qo_len 1) fill ``group_size`` rows of a 16-row tile; their long contexts are split
into key chunks merged in float64 by a second kernel, on a side stream next to the prefill tiles.
``logit_noise`` (the reference's float32 rounding bound) rides along as a second accumulator. The
host plans every tile and uploads the plan in one asynchronous copy: no stream syncs. Group size,
head dims, page size and every option are runtime arguments of the kernel: a campaign compiles one
kernel per tile height, padded head dims and dtypes, whatever it draws (``compile_keys`` names them).

>>> from pa_oracle.oracle.case import Case, Layout, Heads
>>> from pa_oracle.oracle.tensors import make_tensors
>>> case = Case(Layout.from_lengths([1], [3], page_size=2), Heads(1, 1, 4, 4))
>>> fused_reference(case, make_tensors(case)) is None  # CPU tensors: the caller uses ``reference``
True
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from pa_oracle.oracle.case import Case, CaseError
from pa_oracle.oracle.result import LOG2_E, Reference
from pa_oracle.oracle.tensors import Tensors, upload

MAX_HEAD_DIM = 256  # a 256-wide float64 row already costs 2 KiB of registers per tile row
_MIN_DOT = 16  # tl.dot needs every tile dimension >= 16
_MAX_ACC_ELEMENTS = 128 * 128  # float64 accumulator [BLOCK_M, BLOCK_DVO] per program: 128 KiB
_SMALL_BLOCK_MS = (16, 32, 64)  # tiles for requests with few packed rows (decode, speculative)
# the kernel's option bits (``pa_oracle.oracle._fused_kernel.FLAG_BITS``, which must agree: tested)
_FLAG_BITS = {"causal": 1, "window": 2, "soft_cap": 4, "alibi": 8, "sinks": 16, "logit_noise": 32, "partial": 64}
STATIC_NAMES = (*_FLAG_BITS, "group", "head_dims")


@dataclass(frozen=True)
class FusedConfig:
    """Tile sizes and launch shape. ``block_m`` is the tile height of requests with more packed rows
    than the small tiles hold (capped for wide heads), launched with ``num_warps``; requests with fewer use the smallest of 16/32/64 rows that holds them,
    launched with ``small_num_warps``.

    ``split_keys`` (a multiple of ``block_n``; 0: off) splits the key range of those small tiles
    (decode) into chunks at multiples of ``split_keys``, one program each, merged in key order by a
    second kernel: decode keeps the GPU busy instead of one program walking a 4k context. On CUDA
    the small tiles run on a side stream (``side_stream``), alongside the big ones (event
    record/wait, no host sync). ``num_stages`` > 1 compiles the key loop as a ``tl.range`` with
    that many software-pipeline stages (cp.async loads of K and V; on the H200 serving batch 2 stages
    took 10.25 ms, 1 stage 11.85 ms; where they do not fit in shared memory ``fused_reference`` retries
    with 1); 1 keeps a plain loop.
    ``max_registers`` is ptxas's per-thread register cap (``maxnreg``; 0: ptxas picks): left to
    itself ptxas caps some of these float64 tiles at 56-128 registers and spills kilobytes per
    thread (seen compiling for sm_90 offline).
    ``static_options`` names what is compiled into the kernel instead of passed at run time (one
    more compiled variant per value): option flags (``STATIC_NAMES``: "causal", "window",
    "soft_cap", "alibi", "sinks", "logit_noise", "partial"), "group" and "head_dims". The default
    keeps those whose runtime test cost >= 10% on the H200 serving batch (2026-12-01,
    ``benchmarks/fused_oracle_speed.py --specializations``: logit_noise +70% / +20%, group +11%,
    partial +12% with noise off; causal +8%, head_dims +10%/+1% and the others less): so a kernel is
    compiled per group size, noise on/off and partial, and every other option is a runtime value."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 2
    small_num_warps: int = 4
    split_keys: int = 512
    side_stream: bool = True
    max_registers: int = 255
    static_options: tuple[str, ...] = ("group", "logit_noise", "partial")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.static_options) - set(STATIC_NAMES))
        if unknown:
            raise ValueError(f"static_options takes {', '.join(STATIC_NAMES)}; got {', '.join(unknown)}")
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
        if not 0 <= self.max_registers <= 255:
            raise ValueError(f"max_registers must be in [0, 255] (0: ptxas picks), got {self.max_registers}")
        if self.split_keys < 0 or self.split_keys % self.block_n:
            raise ValueError(f"split_keys must be 0 (off) or a multiple of block_n={self.block_n}, got {self.split_keys}")


DEFAULT_CONFIG = FusedConfig()


def unsupported_reason(case: Case) -> str | None:
    """Why the fused kernel does not take ``case`` (None: it does). Every option of
    ``pa_oracle.oracle.case`` is supported but ALiBi added before the soft cap (FlashInfer's order:
    the torch engine computes it) and RoPE; head dims are padded to a power of two >= 16, up to 256."""
    heads = case.heads
    if case.options.rope is not None or case.positions is not None:  # explicit positions are RoPE positions
        return "RoPE (the torch engine rotates q and k first, at the case's positions)"
    if case.options.q_is_fp8:
        return "an fp8 q (the torch engine scales it by q_scale)"
    if case.options.alibi_before_soft_cap:
        return "ALiBi before the soft cap (the torch engine computes that order)"
    if max(heads.head_dim_qk, heads.head_dim_vo) > MAX_HEAD_DIM:
        return f"head dim {max(heads.head_dim_qk, heads.head_dim_vo)} > {MAX_HEAD_DIM}"
    return None


def fused_reference(
    case: Case,
    tensors: Tensors,
    *,
    lse_base: str = "e",
    logit_noise: bool = False,
    config: FusedConfig = DEFAULT_CONFIG,
) -> Reference | None:
    """``reference(case, tensors, lse_base=lse_base, logit_noise=logit_noise)`` computed by the fused
    float64 kernel, or None where it does not apply: tensors not on CUDA, Triton not installed, a
    head dim above 256, or an e4m3 fp8 cache on a GPU below sm_89 (Triton converts e4m3 from sm_89
    on). The result is deterministic and bitwise independent of the other requests of the batch
    (and of their order): a row's tiles, key blocks, split chunks and their merge order depend only
    on its own request and ``config``. Splitting a context (``config.split_keys``) changes a row's
    value only by float64 rounding."""
    _check_lse_base(lse_base)
    if tensors.q.device.type != "cuda" or unsupported_reason(case) is not None:
        return None
    try:
        from pa_oracle.oracle import _fused_kernel  # noqa: F401
    except ImportError:
        return None
    if case.options.kv_dtype == "float8_e4m3fn" and torch.cuda.get_device_capability(tensors.q.device) < (8, 9):
        return None
    try:
        return fused_attention(case, tensors, lse_base=lse_base, logit_noise=logit_noise, config=config)
    except Exception as exc:  # triton's OutOfResources: its module path moved between releases
        if type(exc).__name__ != "OutOfResources" or config.num_stages == 1:
            raise
        # the pipeline's stages of K/V tiles did not fit in shared memory (wide heads, 32-bit KV)
        single = dataclasses.replace(config, num_stages=1)
        return fused_attention(case, tensors, lse_base=lse_base, logit_noise=logit_noise, config=single)


class _Launch(NamedTuple):
    """One tile height's launches: ``tiles`` attention tiles from table row ``first``; when
    ``merges`` > 0 those tiles are split-context chunks whose partial states the ``merges`` merge
    tiles from table row ``merge_first`` combine. ``small``: not the largest height (few packed
    rows: decode, speculative), launched with ``small_num_warps``."""

    block_m: int
    small: bool
    first: int
    tiles: int
    merge_first: int
    merges: int


class _Plan(NamedTuple):
    """Host-built inputs of the launches: ``ints`` holds every tile table then the page table
    (``kv_indices``, from ``pages_offset``; a tile's field 3 indexes ``ints``), ``floats`` the
    float64 parameters. The kernels take ``ints`` whole and a table's start as a runtime offset:
    a sliced pointer's 16-byte alignment would be one more specialization."""

    ints: torch.Tensor
    floats: torch.Tensor
    launches: tuple[_Launch, ...]
    pages_offset: int


def fused_attention(
    case: Case,
    tensors: Tensors,
    *,
    lse_base: str = "e",
    logit_noise: bool = False,
    config: FusedConfig = DEFAULT_CONFIG,
) -> Reference:
    """The fused kernel on CUDA tensors, or on CPU tensors under Triton's interpreter
    (``TRITON_INTERPRET=1``; a test entry point). Raises ``CaseError`` for a case that
    ``unsupported_reason`` rejects and ``ImportError`` without Triton."""
    from pa_oracle.oracle import _fused_kernel as fk

    device = tensors.q.device
    if device.type != "cuda" and not fk.interpreting():
        raise ValueError(f"the fused oracle runs on CUDA tensors (or under TRITON_INTERPRET=1), got {device}")
    return _run(case, tensors, lse_base, logit_noise, config, _launch)


def compile_keys(
    case: Case, tensors: Tensors, *, logit_noise: bool = False, config: FusedConfig = DEFAULT_CONFIG
) -> frozenset[tuple]:
    """The Triton compile keys ``fused_attention`` would launch ``case`` with: one per compiled
    kernel it needs (``pa_oracle.oracle._fused_kernel.specialization_key``), computed without
    launching anything, on tensors of any device. A campaign's distinct keys are the kernels it
    compiles."""
    from pa_oracle.oracle import _fused_kernel as fk

    keys: set[tuple] = set()

    def record(name: str, grid: tuple[int], *args: object, **kwargs: object) -> None:
        keys.add(fk.specialization_key(fk.RAW[name], fk.DO_NOT_SPECIALIZE[name], args, kwargs))

    _run(case, tensors, "e", logit_noise, config, record)
    return frozenset(keys)


def _launch(name: str, grid: tuple[int], *args: object, **kwargs: object) -> None:
    from pa_oracle.oracle import _fused_kernel as fk

    getattr(fk, name)[grid](*args, **kwargs)


def _run(case: Case, tensors: Tensors, lse_base: str, logit_noise: bool, config: FusedConfig,
         launch: Callable[..., None]) -> Reference:
    """Plan ``case`` and hand every kernel launch to ``launch(kernel name, grid, *args, **kwargs)``."""
    from pa_oracle.oracle import _fused_kernel as fk

    _check_lse_base(lse_base)
    reason = unsupported_reason(case)
    if reason is not None:
        raise CaseError(f"the fused oracle does not support this case: {reason}")
    interpret = fk.interpreting()
    device = tensors.q.device
    for name, t in tensors.as_dict().items():
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, q on {device}")

    heads, opts = case.heads, case.options
    q, k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (tensors.q, tensors.k_cache, tensors.v_cache))
    out = torch.empty(case.layout.total_q, heads.num_qo_heads, heads.head_dim_vo, dtype=torch.float64, device=device)
    lse = torch.empty(out.shape[:2], dtype=torch.float64, device=device)
    noise = torch.empty_like(out) if logit_noise else None
    block_dqk, block_dvo = (max(_MIN_DOT, 1 << (d - 1).bit_length()) for d in (heads.head_dim_qk, heads.head_dim_vo))
    plan = _plan(case, _block_ms(config, block_dvo), config, lse_base)
    ints, floats = upload(plan.ints, device), upload(plan.floats, device)
    on = {
        "causal": opts.causal, "window": opts.window_left >= 0, "soft_cap": opts.logits_soft_cap > 0,
        "alibi": opts.alibi_slopes is not None, "sinks": opts.sinks is not None, "logit_noise": logit_noise,
    }  # fmt: skip
    flags = sum(_FLAG_BITS[name] for name, value in on.items() if value)
    static = sum(_FLAG_BITS[name] for name in config.static_options if name in _FLAG_BITS)
    noise_static_off = static & _FLAG_BITS["logit_noise"] and not logit_noise
    common = dict(
        BLOCK_DVO=block_dvo, BLOCK_NOISE=16 if noise_static_off else block_dvo, COMPILED=not interpret,
        STATIC_GROUP=heads.group_size if "group" in config.static_options else 0,
        STATIC_DVO=heads.head_dim_vo if "head_dims" in config.static_options else 0,
    )  # fmt: skip
    if config.max_registers and not interpret:
        common["maxnreg"] = config.max_registers
    side = _side_stream(device, config, plan)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        for item in plan.launches:
            small = item.small
            with torch.cuda.stream(side) if small and side is not None else contextlib.nullcontext():
                rows = item.tiles * heads.num_kv_heads * item.block_m
                part = out.new_empty(3 if logit_noise else 2, rows) if item.merges else out
                part_acc = out.new_empty(2 if logit_noise else 1, rows, block_dvo) if item.merges else out
                if side is not None and small and item.merges:
                    for t in (part, part_acc):  # scratch freed on return, while the side stream may still use it
                        t.record_stream(side)
                tile_flags = flags | (_FLAG_BITS["partial"] if item.merges else 0)
                launch(
                    "attention", (item.tiles * heads.num_kv_heads,),
                    q, k_cache, v_cache, out, lse, noise if noise is not None else out, ints, floats, part, part_acc,
                    q.stride(0), q.stride(1),
                    k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                    v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                    out.stride(0), out.stride(1), lse.stride(0),
                    item.first * fk.TILE_FIELDS.value, heads.num_kv_heads, heads.num_qo_heads, case.layout.page_size, opts.window_left,
                    part.stride(0), part_acc.stride(0), heads.group_size, heads.head_dim_qk, heads.head_dim_vo, tile_flags,
                    BLOCK_DQK=block_dqk, BLOCK_M=item.block_m, BLOCK_N=config.block_n,
                    PIPELINE=config.num_stages if config.num_stages > 1 and not interpret else 0,
                    STATIC=static, STATIC_FLAGS=tile_flags & static,
                    STATIC_DQK=heads.head_dim_qk if "head_dims" in config.static_options else 0,
                    num_warps=config.small_num_warps if small else config.num_warps,
                    num_stages=config.num_stages, **common,
                )  # fmt: skip
                if item.merges:
                    merge_static = static & (_FLAG_BITS["sinks"] | _FLAG_BITS["logit_noise"])
                    launch(
                        "merge", (item.merges * heads.num_kv_heads,),
                        out, lse, noise if noise is not None else out, ints, floats, part, part_acc,
                        out.stride(0), out.stride(1), lse.stride(0), item.merge_first * fk.TILE_FIELDS.value,
                        heads.num_kv_heads, heads.num_qo_heads, part.stride(0), part_acc.stride(0),
                        heads.group_size, heads.head_dim_vo, flags,
                        BLOCK_M=item.block_m, STATIC=merge_static, STATIC_FLAGS=flags & merge_static,
                        num_warps=config.small_num_warps, **common,
                    )  # fmt: skip
        if side is not None:
            torch.cuda.current_stream(device).wait_stream(side)
    return Reference(out, lse, noise)


def _side_stream(device: torch.device, config: FusedConfig, plan: _Plan) -> torch.cuda.Stream | None:
    """A stream for the small tiles that waits for the work queued so far (the uploads, the
    caller's tensors), or None: off, not CUDA, or only one kind of tile to run."""
    if device.type != "cuda" or not config.side_stream:
        return None
    small = {launch.small for launch in plan.launches}
    if len(small) < 2:
        return None
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    return side


def _block_ms(config: FusedConfig, block_dvo: int) -> tuple[int, ...]:
    """The tile heights, ascending: the small ones, then the configured one (capped so that the
    float64 accumulator stays at most 128 x 128; the logit noise adds a second one, which spills
    less in 128-row tiles than in 64-row ones, so it does not shrink them)."""
    big = max(_MIN_DOT, min(config.block_m, _MAX_ACC_ELEMENTS // block_dvo))
    return tuple(sorted({m for m in _SMALL_BLOCK_MS if m < big} | {big}))


def _plan(case: Case, block_ms: tuple[int, ...], config: FusedConfig, lse_base: str) -> _Plan:
    """Every tile of every request, one launch per tile height. A request's packed rows
    (``qo_len * group_size``, query-major) go to the smallest tile height that holds them, else
    to tiles of the largest; within a launch the tiles of longer contexts come first, so the
    long programs start early. Small tiles are split into key chunks (``config.split_keys``) when
    one of them spans more than one chunk."""
    from pa_oracle.oracle._fused_kernel import PARAMS, TILE_FIELDS

    layout, heads, opts = case.layout, case.heads, case.options
    qo_indptr = np.asarray(layout.qo_indptr, dtype=np.int64)
    kv_indptr = np.asarray(layout.kv_indptr, dtype=np.int64)
    kv_lens = np.asarray(layout.kv_lens, dtype=np.int64)
    rows = np.diff(qo_indptr) * heads.group_size
    fits = np.searchsorted(np.asarray(block_ms), rows)  # the first height >= rows
    height = np.asarray(block_ms)[np.minimum(fits, len(block_ms) - 1)]
    tables: list[np.ndarray] = []
    launches, first = [], 0
    for block_m in block_ms[::-1]:
        requests = np.flatnonzero((height == block_m) & (rows > 0))
        requests = requests[np.argsort(-kv_lens[requests], kind="stable")]
        counts = -(-rows[requests] // block_m)
        if counts.sum() == 0:
            continue
        request = np.repeat(requests, counts)
        tile_in_request = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        qo_lens = qo_indptr[request + 1] - qo_indptr[request]
        table = np.stack(
            [
                qo_indptr[request],
                qo_lens,
                kv_lens[request],
                kv_indptr[request],
                tile_in_request * block_m,
                np.zeros_like(request),
                kv_lens[request],
            ],
            axis=1,
        )
        small = block_m < block_ms[-1]
        chunks = _chunks(table, block_m, heads.group_size, case, config.split_keys) if small else None
        if chunks is None:
            tables.append(table)
            launches.append(_Launch(block_m, small, first, len(table), 0, 0))
            first += len(table)
            continue
        begins, counts = chunks
        split = np.repeat(table, counts, axis=0)
        split[:, 5] = begins
        split[:, 6] = begins + config.split_keys
        merge = table.copy()
        merge[:, 5] = np.cumsum(counts) - counts  # the tile's first scratch slot (split row, launch-relative)
        merge[:, 6] = counts
        tables += [split, merge]
        launches.append(_Launch(block_m, small, first, len(split), first + len(split), len(merge)))
        first += len(split) + len(merge)
    pages_offset = first * TILE_FIELDS.value
    for table in tables:  # field 3: the request's first page-table entry, as an index into ``ints``
        table[:, 3] += pages_offset
    pages = np.asarray(layout.kv_indices, dtype=np.int64)
    ints = np.concatenate([*(t.reshape(-1) for t in tables), pages, np.zeros(1, dtype=np.int64)])  # never empty
    q_scale = case.sm_scale * (opts.k_scale if opts.is_fp8 else 1.0)
    v_scale = opts.v_scale if opts.is_fp8 else 1.0
    floats = [q_scale, v_scale, opts.logits_soft_cap, LOG2_E if lse_base == "2" else 1.0]
    assert len(floats) == PARAMS.value and all(t.shape[1] == TILE_FIELDS.value for t in tables)
    zeros = (0.0,) * heads.num_qo_heads
    floats += [*(opts.alibi_slopes or zeros), *(opts.sinks or zeros)]
    return _Plan(torch.from_numpy(ints), torch.tensor(floats, dtype=torch.float64), tuple(launches), pages_offset)


def _chunks(table: np.ndarray, block_m: int, group: int, case: Case, split_keys: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Each tile's key chunks as (first key of every chunk, chunk count per tile), or None when no
    tile needs more than one. Chunk ``c`` is keys ``[c * split_keys, (c + 1) * split_keys)``; a
    tile's chunks cover the key blocks its rows can attend (the kernel's own bounds, which it
    applies again within each chunk)."""
    if split_keys == 0:
        return None
    qo_len, kv_len, m_start = table[:, 1], table[:, 2], table[:, 4]
    opts = case.options
    last_query = np.minimum(qo_len, (m_start + block_m - 1) // group + 1) - 1
    hi = np.minimum(kv_len, kv_len - qo_len + last_query + 1) if opts.causal else kv_len
    lo = np.maximum(0, kv_len - qo_len + m_start // group - opts.window_left) if opts.window_left >= 0 else np.zeros_like(kv_len)
    first_chunk = lo // split_keys
    counts = np.maximum(1, -(-hi // split_keys) - first_chunk)
    if counts.max() <= 1:
        return None
    starts = np.repeat(first_chunk - (np.cumsum(counts) - counts), counts) + np.arange(counts.sum())
    return starts * split_keys, counts


def _check_lse_base(lse_base: str) -> None:
    if lse_base not in ("e", "2"):
        raise ValueError(f"lse_base must be 'e' or '2', got {lse_base!r}")


__all__ = ["DEFAULT_CONFIG", "STATIC_NAMES", "FusedConfig", "compile_keys", "fused_attention", "fused_reference", "unsupported_reason"]
