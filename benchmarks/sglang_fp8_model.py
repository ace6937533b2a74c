"""What SGLang's Triton extend kernel computes on an fp8 KV pool, modelled in float64 (evidence for
issue 14's e5m2 lead, not product: nothing in the package imports it), and the kernel measured
against it and against the oracle on drawn cases.

    python benchmarks/sglang_fp8_model.py --case golden/cases/sglang-extend-fp8-kv.json \
        --kv-dtype float8_e5m2:150:16 --kv-dtype float8_e4m3fn:60:6 --only q_dtypes=bfloat16   # CUDA + SGLang
    python benchmarks/sglang_fp8_model.py --identity 20                                          # CPU

The model applies exactly the roundings ``_fwd_kernel`` of sglang 0.5.10.post1
(``srt/layers/attention/triton_ops/extend_attention.py``) applies, each a named mechanism:

- ``q_to_cache`` (line 378, prefix stage): ``tl.dot(q.to(k.dtype), k)``: q rounded (RTNE, Triton's
  default downcast; saturating) to the pool's dtype, so to fp8 on an fp8 pool;
- ``p_to_cache`` (line 419): ``p = p.to(v.dtype)``: the prefix probabilities ``exp(s - running max)``
  rounded to the pool's dtype before ``tl.dot(p, v) * v_scale``, while ``deno`` (line 407) sums the
  unrounded ``p``;
- ``p_to_q_dtype`` (line 523, extend stage): the same with ``v_extend``'s dtype, q's;
- ``extend_kv``: the adapter's ``k_extend``/``v_extend``, ``(stored.float() * scale).to(q.dtype)``;
- ``fp32_constants``: ``sm_scale * k_scale`` (line 391), ``sm_scale`` (497), ``logit_cap`` and the
  sinks as the float32 numbers the kernel holds;
- ``tanh_fp32`` (lines 108-110, 394, 500): the soft cap ``logit_cap * tanh(qk / logit_cap)`` with
  ``tanh(x) = 2 * sigmoid(2x) - 1``, in float32 (its cancellation near 0 moves the capped logits by far
  more than float32's own rounding, enough to flip an fp8 rounding of ``p``).

The running max is taken per ``BLOCK_N`` key block (prefix blocks from the first prefix key, then
extend blocks from the first extend key), as the kernel's online softmax does, because it sets
what ``p`` is when it is rounded. Not modelled: the float32 arithmetic (dot accumulation, ``exp``,
the accumulators; on sm_90 Triton accumulates fp8 dots imprecisely) and the bf16 output store.
With no rounding the model is the oracle's definition (``--identity`` checks it to ~1e-12). Stored
in bf16, it gives the golden e4m3 case's H200 error to the digit (max 0.01945, mean 0.006765:
``golden/reports/sglang-fp8-extend-q-rounding``).

The GPU run draws cases for ``sglang-extend-mask`` as a campaign does (``--only kv_dtypes=...``:
the strategies also draw q's own dtype, dropped here; ``--only`` narrows further, and only the
cases of the most drawn kernel variants are kept, to bound Triton's compiles), judges each with
the campaign's ``check_case`` and prints, per failing case, the kernel's error against the oracle,
the allowed error, and against the model and its ablations (without ``q_to_cache``, without
``p_to_cache``, q truncated instead of rounded). "The model explains the failures" when
kernel-vs-model is below ``--explained`` (0.2) of kernel-vs-oracle on every failing case; the
part of kernel-vs-model past half an ulp of the output dtype (the store, not modelled) is printed too.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Collection, Iterable
from pathlib import Path

import numpy as np
import torch
from pa_oracle.oracle.case import FP8_DTYPES, Case
from pa_oracle.oracle.tensors import Tensors, token_addresses
from pa_oracle.oracle.visibility import attended

MECHANISMS = ("q_to_cache", "p_to_cache", "p_to_q_dtype", "extend_kv", "fp32_constants", "tanh_fp32")
KERNEL = frozenset(MECHANISMS)  # every rounding the kernel (and the adapter) applies
EXACT = frozenset()  # none: the oracle's definition
BLOCK_N = 64  # _get_block_sizes_for_extend_attention: BLOCK_N on sm_90 (Hopper) for Lq <= 256
BACKEND = "sglang-extend-mask"


def rounded(x: torch.Tensor, dtype: torch.dtype, mode: str = "rtne") -> torch.Tensor:
    """``x`` rounded as a Triton downcast to ``dtype`` (via float32; RTNE, or ``mode="rtz"`` toward
    zero for an fp8 ``dtype``; fp8 saturating, as the ``cvt.rn.satfinite`` conversions do), back in
    float64."""
    x32 = x.to(torch.float32)
    if dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        return x32.to(dtype).to(torch.float64)
    info = torch.finfo(dtype)
    x32 = x32.clamp(-info.max, info.max)
    if mode == "rtne":
        return x32.to(dtype).to(torch.float64)
    if mode != "rtz":
        raise ValueError(f"mode must be 'rtne' or 'rtz', got {mode!r}")
    a = x32.to(torch.float64).abs()
    _, exponent = torch.frexp(a)  # a = m * 2**exponent, m in [0.5, 1)
    mantissa_bits = round(-np.log2(info.eps))
    spacing = torch.ldexp(torch.ones_like(a), exponent - 1 - mantissa_bits).clamp(min=info.smallest_normal * info.eps)
    return torch.floor(a / spacing) * spacing * torch.sign(x32.to(torch.float64))


def _fp32(value: float, on: bool) -> float:
    return float(np.float32(value)) if on else float(value)


def _blocks(prefix: int, extend: int, block_n: int) -> list[slice]:
    """The kernel's key blocks of one request: prefix columns from 0, then extend columns from ``prefix``."""
    pre = [slice(a, min(a + block_n, prefix)) for a in range(0, prefix, block_n)]
    return pre + [slice(prefix + a, prefix + min(a + block_n, extend)) for a in range(0, extend, block_n)]


def modelled_output(
    case: Case, tensors: Tensors, *, roundings: Collection[str] = KERNEL, block_n: int = BLOCK_N, q_rounding: str = "rtne"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 ``(out [total_q, Hq, Dvo], lse [total_q, Hq])`` of ``extend_attention_fwd`` as the
    ``sglang-extend(-mask)`` adapters call it on ``case``, with the kernel's ``roundings`` (a subset
    of ``MECHANISMS``) applied. ``lse`` is natural-log over the keys (the sink excluded, as the
    oracle's); a row with no key gives out 0 and lse -inf. ``q_rounding="rtz"``: the alternative
    hypothesis that ``q.to(k.dtype)`` truncates (Triton asks for RTNE)."""
    unknown = set(roundings) - set(MECHANISMS)
    if unknown:
        raise ValueError(f"roundings: unknown mechanisms {sorted(unknown)}; known: {MECHANISMS}")
    opts, heads, lay = case.options, case.heads, case.layout
    if opts.rope is not None or opts.alibi_slopes is not None or opts.q_is_fp8 or heads.mla:
        raise ValueError("the SGLang extend adapters take no RoPE, ALiBi, fp8 q or MLA case")
    device, f64 = tensors.q.device, torch.float64
    q_dtype, cache_dtype = tensors.q.dtype, tensors.k_cache.dtype
    fp8 = opts.kv_dtype in FP8_DTYPES
    k_scale, v_scale = (opts.k_scale, opts.v_scale) if fp8 else (1.0, 1.0)  # the adapter passes the case's
    on = roundings.__contains__
    prefix_scale = _fp32(_fp32(case.sm_scale, on("fp32_constants")) * _fp32(k_scale, on("fp32_constants")), on("fp32_constants"))
    extend_scale = _fp32(case.sm_scale, on("fp32_constants"))
    cap = _fp32(opts.logits_soft_cap, on("fp32_constants"))
    hkv, group, dvo = heads.num_kv_heads, heads.group_size, heads.head_dim_vo
    sinks = None
    if opts.sinks is not None:
        sinks = torch.tensor([_fp32(s, on("fp32_constants")) for s in opts.sinks], dtype=f64, device=device).view(hkv, group, 1)
    pages, slots = (t.to(device) for t in token_addresses(case))
    keys, values = tensors.k_cache[pages, slots], tensors.v_cache[pages, slots]  # stored dtype, [total_kv, Hkv, D]
    out = torch.zeros(lay.total_q, heads.num_qo_heads, dvo, dtype=f64, device=device)
    lse = torch.full((lay.total_q, heads.num_qo_heads), float("-inf"), dtype=f64, device=device)
    kv_start = 0
    for b, allowed in enumerate(attended(case)):
        qo, kv = allowed.shape
        rows, toks = slice(lay.qo_indptr[b], lay.qo_indptr[b + 1]), slice(kv_start, kv_start + kv)
        kv_start += kv
        if qo == 0 or kv == 0:
            continue
        prefix = kv - qo
        q = tensors.q[rows].view(qo, hkv, group, -1).permute(1, 2, 0, 3)  # [Hkv, G, qo, D] stored dtype
        q_prefix = rounded(q, cache_dtype, q_rounding) if on("q_to_cache") and cache_dtype != q_dtype else q.to(f64)
        k, v = keys[toks].permute(1, 0, 2), values[toks].permute(1, 0, 2)  # [Hkv, kv, D]
        k_pre, v_pre = k[:, :prefix].to(f64), v[:, :prefix].to(f64)  # stored values; scales after the dots
        k_ext, v_ext = _extend_rows(k[:, prefix:], k_scale, fp8, q_dtype, on("extend_kv")), _extend_rows(v[:, prefix:], v_scale, fp8, q_dtype, on("extend_kv"))
        s = torch.cat([
            torch.matmul(q_prefix, k_pre[:, None].transpose(-1, -2)) * prefix_scale,
            torch.matmul(q.to(f64), k_ext[:, None].transpose(-1, -2)) * extend_scale,
        ], dim=-1)  # [Hkv, G, qo, kv]
        if cap > 0 and on("tanh_fp32"):
            f32_cap = torch.tensor(cap, dtype=torch.float32, device=device)
            s = (f32_cap * (2 * torch.sigmoid(2 * (s.float() / f32_cap)) - 1)).to(f64)
        elif cap > 0:
            s = torch.tanh(s / cap) * cap
        s = s.masked_fill(~torch.from_numpy(allowed).to(device), float("-inf"))
        o, row_lse = _online_softmax(s, _blocks(prefix, qo, block_n), prefix, (v_pre, v_scale), v_ext,
                                     cache_dtype if on("p_to_cache") else None, q_dtype if on("p_to_q_dtype") else None, sinks)
        out[rows] = o.permute(2, 0, 1, 3).reshape(qo, -1, dvo)
        lse[rows] = row_lse.permute(2, 0, 1).reshape(qo, -1)
    return out, lse


def _extend_rows(stored: torch.Tensor, scale: float, fp8: bool, q_dtype: torch.dtype, rounds: bool) -> torch.Tensor:
    """The adapter's extend K or V [Hkv, qo, D]: fp8 rows dequantized in float32 and cast to q's dtype."""
    if not fp8:
        return stored.to(torch.float64)
    if rounds:
        return (stored.float() * scale).to(q_dtype).to(torch.float64)
    return stored.to(torch.float64) * scale


def _online_softmax(
    s: torch.Tensor, blocks: list[slice], prefix: int, v_prefix: tuple[torch.Tensor, float], v_extend: torch.Tensor,
    p_prefix_dtype: torch.dtype | None, p_extend_dtype: torch.dtype | None, sinks: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's blockwise softmax of logits ``s`` [Hkv, G, qo, kv]: each block's ``p`` is
    ``exp(s - max so far)``, rounded (dtype not None) before it weighs V, while the denominator
    sums it unrounded; the accumulator's rescaling is exact. Returns (out, lse) over the keys."""
    running = torch.full(s.shape[:-1], float("-inf"), dtype=s.dtype, device=s.device)
    maxima = []
    for cols in blocks:
        running = torch.maximum(running, s[..., cols].amax(-1))
        maxima.append(running)
    final = running
    final_safe = torch.where(torch.isinf(final), 0.0, final)
    acc = s.new_zeros(*s.shape[:-1], v_extend.shape[-1])
    for cols, m in zip(blocks, maxima):
        m_safe = torch.where(torch.isinf(m), 0.0, m)  # a row with no key yet: its p are exp(-inf) = 0
        p = torch.exp(s[..., cols] - m_safe[..., None])
        in_prefix = cols.start < prefix
        dtype = p_prefix_dtype if in_prefix else p_extend_dtype
        if dtype is not None:
            p = rounded(p, dtype)
        if in_prefix:
            v, v_scale = v_prefix[0][:, None, cols], v_prefix[1]
            part = torch.matmul(p, v) * v_scale
        else:
            part = torch.matmul(p, v_extend[:, None, cols.start - prefix : cols.stop - prefix])
        acc += torch.exp(m - final_safe)[..., None] * part  # 0 where m is -inf
    deno = torch.exp(s - final_safe[..., None]).sum(-1)
    empty = torch.isinf(final)
    lse = torch.where(empty, float("-inf"), final_safe + torch.log(torch.where(empty, 1.0, deno)))
    if sinks is not None:
        deno = deno + torch.exp(sinks - final_safe)
    out = torch.where(empty[..., None], 0.0, acc / torch.where(empty, 1.0, deno)[..., None])
    return out, lse


# --- measurement --------------------------------------------------------------------------------


def draw_for(kv_dtype: str, count: int, base_seed: int, caps_source: str, only: tuple[str, ...] = ()) -> list[Case]:
    """``count`` distinct cases the campaign's strategy draws for ``sglang-extend-mask`` with ``--only
    kv_dtypes=kv_dtype`` and ``only`` (the installed adapter's capabilities, or with ``caps_source
    "declared"`` the ones it declares on an SGLang whose kernel takes ``k_scale``/``v_scale``: on
    CPU), keeping those with that KV dtype (the strategies also draw q's own) that it runs."""
    from hypothesis import HealthCheck, given, seed, settings
    from pa_oracle.backends import get_backend
    from pa_oracle.backends.sglang_extend import capabilities_for
    from pa_oracle.fuzz.cli import narrow
    from pa_oracle.fuzz.draw.determinism import seed_only_draws
    from pa_oracle.fuzz.draw.strategies import Limits, cases

    backend = get_backend(BACKEND)
    if caps_source == "declared":
        backend.capabilities = capabilities_for({"k_scale", "v_scale"}).replace(custom_mask=(True,))  # type: ignore[misc]
    narrow(backend, (f"kv_dtypes={kv_dtype if kv_dtype in FP8_DTYPES else ''}", *only))
    drawn: list[Case] = []
    seen: set[str] = set()

    @seed(base_seed)
    @settings(max_examples=3 * count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(cases(backend.capabilities, Limits()))
    def collect(case: Case) -> None:
        if case.case_id in seen or len(drawn) >= count:  # Hypothesis draws some cases more than once
            return
        if case.options.kv_dtype == kv_dtype and backend.unsupported_reason(case) is None:
            seen.add(case.case_id)
            drawn.append(case)

    with seed_only_draws():
        collect()
    return drawn


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.to(torch.float64) - b.to(torch.float64)).abs().max()) if a.numel() else 0.0


def identity(count: int, base_seed: int, only: tuple[str, ...] = ()) -> int:
    """The model without roundings against the oracle's reference (CPU); exit code 1 past 1e-12."""
    from pa_oracle.oracle.reference import reference
    from pa_oracle.oracle.tensors import make_tensors

    worst = 0.0
    for kv_dtype in ("bfloat16", "float16", "float8_e5m2", "float8_e4m3fn"):
        for case in draw_for(kv_dtype, count, base_seed, "declared", only):
            tensors = make_tensors(case)
            ref = reference(case, tensors, engine="torch")
            out, lse = modelled_output(case, tensors, roundings=EXACT)
            finite = torch.isfinite(ref.lse)
            error = max(max_abs(out, ref.out), max_abs(lse[finite], ref.lse[finite]))
            worst = max(worst, error)
            print(f"{kv_dtype:14s} {case.summary()[:90]:90s} |model - oracle| {error:.2e}")
    print(f"worst {worst:.2e}")
    return 0 if worst < 1e-12 else 1


def _kernel_key(case: Case) -> tuple:
    """What the Triton kernel compiles per (constexprs and dtypes), to bound the compile count."""
    from pa_oracle.backends.sglang_extend_mask import sglang_mask

    h, o = case.heads, case.options
    return (o.q_dtype, o.kv_dtype, h.head_dim_qk, h.head_dim_vo, h.group_size == 1, o.logits_soft_cap, o.sinks is not None,
            sglang_mask(case)[2])


def few_variants(drawn: list[Case], max_variants: int) -> list[Case]:
    """The drawn cases of the ``max_variants`` most drawn kernel variants, in drawn order."""
    counts = collections.Counter(_kernel_key(c) for c in drawn)
    kept = {key for key, _ in counts.most_common(max_variants)}
    return [c for c in drawn if _kernel_key(c) in kept]


# the kernel against each: the model, without one rounding, and with q truncated instead of rounded
ABLATIONS: dict[str, dict] = {"model": {}, "no_q": {"roundings": KERNEL - {"q_to_cache"}},
                              "no_p": {"roundings": KERNEL - {"p_to_cache"}}, "q_rtz": {"q_rounding": "rtz"}}
COLUMNS = ("oracle", "allowed", *ABLATIONS, "beyond_store", "model_oracle")


def judged_row(backend: object, case: Case) -> dict | str:
    """One case: the campaign's verdict (``check_case``) and the kernel's max error against the
    oracle, the allowed error, against each model of ``ABLATIONS`` (and against the model past half
    an ulp of the output dtype: what the output's store cannot explain), and the model's against
    the oracle; or why it was not judged."""
    from pa_oracle.fuzz.run.runner import check_case
    from pa_oracle.oracle.reference import half_ulp, reference
    from pa_oracle.oracle.tensors import make_tensors

    outcome = check_case(backend, case, keep_output=True)  # type: ignore[arg-type]
    verdict = outcome.verdict
    if outcome.status not in ("pass", "fail") or verdict is None or verdict.out is None or outcome.output is None:
        return f"{outcome.status}: {outcome.message[:100]}"
    tensors = make_tensors(case, backend.device or "cuda")  # type: ignore[attr-defined]
    kernel = outcome.output.out.to(tensors.q.device)
    models = {name: modelled_output(case, tensors, **kwargs)[0] for name, kwargs in ABLATIONS.items()}
    row: dict = {"status": outcome.status, "oracle": verdict.out.max_error, "allowed": verdict.out.limit_max}
    row.update({name: max_abs(kernel, out) for name, out in models.items()})
    # what the bf16 (fp16) store of the output cannot explain: past half an ulp of the model's value
    beyond = (kernel.to(torch.float64) - models["model"]).abs() - half_ulp(models["model"], kernel.dtype)
    row["beyond_store"] = float(beyond.clamp(min=0).max()) if beyond.numel() else 0.0
    row["model_oracle"] = max_abs(models["model"], reference(case, tensors, engine="torch").out)
    return row


def measure(kv_dtype: str, drawn: Iterable[Case], time_budget: float, explained: float, table: list[str]) -> list[str]:
    """Judge each case and compare the kernel with the models; the summary lines."""
    from pa_oracle.backends import get_backend

    backend = get_backend(BACKEND)
    start, lines, rows = time.monotonic(), [], []
    for case in drawn:
        if time.monotonic() - start > time_budget:
            lines.append(f"  time budget {time_budget:.0f}s spent: stopped after {len(rows)} cases")
            break
        row = judged_row(backend, case)
        if isinstance(row, str):
            lines.append(f"  {row[:80]}  {case.summary()[:40]}")
            continue
        row["case"] = case
        rows.append(row)
        table.append("\t".join([kv_dtype, row["status"], *(f"{row[k]:.4g}" for k in COLUMNS), case.summary()]))
    failing = [r for r in rows if r["status"] == "fail"]
    passing = [r for r in rows if r["status"] == "pass"]
    lines.insert(0, f"{kv_dtype}: {len(rows)} cases judged, {len(failing)} fail the oracle, {len(passing)} pass "
                    f"({time.monotonic() - start:.0f}s)")
    if passing:
        noise = sorted(r["model"] for r in passing)
        lines.append(f"  passing: kernel-vs-model max {noise[-1]:.3g} median {noise[len(noise) // 2]:.3g} (past the store's "
                     f"half ulp max {max(r['beyond_store'] for r in passing):.3g}); kernel-vs-oracle max "
                     f"{max(r['oracle'] for r in passing):.3g}")
    lines.append("  failing, the 8 least explained then the 4 largest: oracle_err allowed | kernel-vs-model, -no_q, -no_p, "
                 "q_rtz (each / oracle_err) | model-vs-oracle")
    distinct = list({(r["oracle"], r["model"]): r for r in failing}.values())  # storages of one case give one result
    least = sorted(distinct, key=lambda r: -r["model"] / r["oracle"])[:8]
    for r in least + [r for r in sorted(distinct, key=lambda r: -r["oracle"]) if r not in least][:4]:
        ratios = " ".join(f"{r[k]:.4f}({r[k] / r['oracle']:.2f})" for k in ABLATIONS)
        lines.append(f"  {r['oracle']:.4f} {r['allowed']:.4f} | {ratios} | {r['model_oracle']:.4f}  {r['case'].summary()[:50]}")
    if failing:
        worst = {k: max(r[k] / r["oracle"] for r in failing) for k in ABLATIONS}
        best = {k: min(r[k] / r["oracle"] for r in failing) for k in ABLATIONS}
        verdict = "EXPLAINED" if worst["model"] < explained else "NOT EXPLAINED"
        beyond = max(r["beyond_store"] / r["oracle"] for r in failing)
        over = sum(r["model"] / r["oracle"] >= explained for r in failing)
        lines.append(f"  {verdict}: kernel-vs-model / kernel-vs-oracle at most {worst['model']:.3f} over the {len(failing)} "
                     f"failing cases ({over} at >= {explained}); past the output store's half ulp at most {beyond:.3f}")
        lines.append(f"  ablations, (min, max) of that ratio: without q_to_cache ({best['no_q']:.2f}, {worst['no_q']:.2f}), "
                     f"without p_to_cache ({best['no_p']:.2f}, {worst['no_p']:.2f}), q truncated ({best['q_rtz']:.2f}, "
                     f"{worst['q_rtz']:.2f})")
    return lines


def saved_case_line(path: Path) -> str:
    """One saved case judged: the kernel's max and mean error against the oracle and the model's
    predicted ones (bf16-stored), and kernel-vs-model."""
    from pa_oracle.backends import get_backend
    from pa_oracle.oracle.reference import reference
    from pa_oracle.oracle.tensors import load_case, make_tensors

    backend = get_backend(path_backend(path))
    case = load_case(path)
    row = judged_row(backend, case)
    if isinstance(row, str):
        return f"{path.name}: {row}"
    tensors = make_tensors(case, backend.device or "cuda")
    ref = reference(case, tensors, engine="torch").out
    predicted = (modelled_output(case, tensors)[0].to(tensors.q.dtype).to(torch.float64) - ref).abs()
    return (f"{path.name} on {backend.name}: {row['status']}, kernel-vs-oracle max {row['oracle']:.5f}; the model predicts "
            f"max {float(predicted.max()):.5f} mean {float(predicted.mean()):.6f} (stored in {tensors.q.dtype}); "
            f"kernel-vs-model max {row['model']:.5f} (past the store's half ulp {row['beyond_store']:.2g})")


def path_backend(path: Path) -> str:
    """The backend a saved case was found on (its ``meta.found_by.backend``), else ``BACKEND``."""
    import json

    found = json.loads(path.read_text()).get("meta", {}).get("found_by", {})
    return found.get("backend") or BACKEND


def paired_line(table: list[str]) -> str:
    """The kernel's error on e5m2 over its error on e4m3 for the cases drawn in both (one seed draws
    the same cases but for the fp8 dtype): e5m2's rounding step is twice e4m3's."""
    import statistics

    by_dtype: dict[str, dict[str, float]] = collections.defaultdict(dict)
    for line in table[1:]:
        fields = line.split("\t")
        kv_dtype, oracle, summary = fields[0], float(fields[2]), fields[-1]
        by_dtype[kv_dtype][summary.replace(kv_dtype, "fp8")] = oracle
    e5, e4 = by_dtype.get("float8_e5m2", {}), by_dtype.get("float8_e4m3fn", {})
    ratios = sorted(e5[k] / e4[k] for k in e5.keys() & e4.keys() if e4[k] > 0)
    if not ratios:
        return "paired: no case judged in both fp8 dtypes"
    quart = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
    return (f"paired: {len(ratios)} cases judged in both fp8 dtypes: kernel-vs-oracle e5m2 / e4m3 median "
            f"{statistics.median(ratios):.2f} (quartiles {quart[0]:.2f}, {quart[1]:.2f})")


def _specs(raw: list[str]) -> list[tuple[str, int, int]] | str:
    """``DTYPE:COUNT:VARIANTS`` items as (kv dtype, cases, kernel variants), or what is wrong."""
    specs = []
    for spec in raw:
        parts = spec.split(":")
        if len(parts) != 3 or parts[0] not in FP8_DTYPES or not (parts[1].isdigit() and parts[2].isdigit()):
            return f"--kv-dtype takes DTYPE:COUNT:VARIANTS with DTYPE one of {FP8_DTYPES}, got {spec!r}"
        specs.append((parts[0], int(parts[1]), int(parts[2])))
    return specs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kv-dtype", action="append", default=[], metavar="DTYPE:COUNT:VARIANTS",
                        help="an fp8 KV dtype, how many cases to judge, in at most how many kernel variants (compiles: "
                             "the cases of the most drawn ones are kept); repeatable; CUDA + SGLang")
    parser.add_argument("--identity", type=int, default=0, metavar="N",
                        help="CPU: N drawn cases per KV dtype, the model without roundings against the oracle")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", default=[], metavar="FIELD=VALUES",
                        help="narrow the drawn cases as a campaign's --only does (e.g. q_dtypes=bfloat16)")
    parser.add_argument("--time-budget", type=float, default=100.0,
                        help="seconds of judging in all, shared by the dtypes in proportion to their counts")
    parser.add_argument("--explained", type=float, default=0.2, help="the criterion: kernel-vs-model below this share of kernel-vs-oracle")
    parser.add_argument("--table", type=Path, help="write one tab-separated line per judged case here")
    parser.add_argument("--case", action="append", default=[], type=Path, metavar="CASE.json",
                        help="also judge this saved case (e.g. golden/cases/sglang-extend-fp8-kv.json)")
    args = parser.parse_args(argv)
    if args.identity:
        return identity(args.identity, args.seed, tuple(args.only))
    specs = _specs(args.kv_dtype)
    if isinstance(specs, str) or not (specs or args.case):
        print(specs or "give at least one --kv-dtype DTYPE:COUNT:VARIANTS (or --identity N)", file=sys.stderr)
        return 2
    from pa_oracle.backends import get_backend

    reason = get_backend(BACKEND).unavailable_reason()
    if reason:
        print(f"{BACKEND} is unavailable: {reason}", file=sys.stderr)
        return 2
    table = ["\t".join(("kv_dtype", "status", *COLUMNS, "case"))]
    for path in args.case:
        print(saved_case_line(path), flush=True)
    total = max(1, sum(count for _, count, _ in specs))
    for kv_dtype, count, variants in specs:
        start = time.monotonic()
        drawn = few_variants(draw_for(kv_dtype, 3 * count, args.seed, "installed", tuple(args.only)), variants)[:count]
        print(f"{kv_dtype}: {len(drawn)} cases in {len({_kernel_key(c) for c in drawn})} kernel variants, "
              f"drawn in {time.monotonic() - start:.0f}s", flush=True)
        for line in measure(kv_dtype, drawn, args.time_budget * count / total, args.explained, table):
            print(line, flush=True)
        if args.table:  # after each dtype: a run cut short keeps what it judged
            args.table.write_text("\n".join(table) + "\n")
    if len(specs) > 1:
        print(paired_line(table), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
