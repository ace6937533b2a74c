"""The tolerance model: pass/fail from measured error, never from a fixed atol.

A kernel's output in dtype ``d`` is compared with the float64 reference, and so is a *control*:
the plain computation of the same case with every step in ``d`` (``plain_attention``). The kernel
passes when

    max|kernel - ref|  <= max_ratio  * max|control - ref|  + floor
    mean|kernel - ref| <= mean_ratio * mean|control - ref| + mean_floor

where ``floor`` (``mean_floor``) is twice the largest (mean) rounding *bound* of the reference in
``d``, half an ulp of each element (FA3's ``fwd_atol`` uses the realized rounding error; the bound
does not drop to 0 on values that happen to be representable, so correct fp32 kernels whose
algorithm differs from the control's are not flagged). That is flash-attn's rule (``<= 2-3x`` the same-precision error), with FA3's noise
floor and its mean rule. Finiteness is its own check: only an empty row's LSE may be -inf, and
an empty row's output must be exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from pa_oracle.oracle.case import Case, CaseError
from pa_oracle.oracle.reference import Reference, half_ulp


@dataclass(frozen=True)
class Tolerance:
    max_ratio: float = 3.0
    mean_ratio: float = 2.0
    floor_factor: float = 2.0

    def __post_init__(self) -> None:
        for name in ("max_ratio", "mean_ratio", "floor_factor"):
            if not getattr(self, name) >= 1.0:
                raise ValueError(f"{name} must be >= 1 (a kernel may be at least as accurate as the control)")


@dataclass(frozen=True)
class ErrorStats:
    """Errors of one output (``out`` or ``lse``) against the float64 reference."""

    name: str
    max_error: float
    mean_error: float
    control_max_error: float
    control_mean_error: float
    floor: float
    numel: int
    mismatches: int  # elements whose error exceeds limit_max
    limit_max: float
    limit_mean: float

    @property
    def ratio(self) -> float:
        """Kernel max error over control max error (the number flash-attn's tests assert on)."""
        if self.control_max_error == 0:
            return 0.0 if self.max_error == 0 else float("inf")
        return self.max_error / self.control_max_error


@dataclass
class Verdict:
    passed: bool
    failures: list[str] = field(default_factory=list)
    out: ErrorStats | None = None
    lse: ErrorStats | None = None
    error: torch.Tensor | None = None  # |kernel - ref| of out, [total_q, Hq, Dvo], float64 (NaN -> inf)
    lse_error: torch.Tensor | None = None  # |kernel - ref| of lse, [total_q, Hq]; a wrong empty row is inf

    def headline(self) -> str:
        if self.passed:
            return "PASS" + (f" (max error {self.out.ratio:.2f}x the control's)" if self.out else "")
        return "FAIL: " + "; ".join(self.failures)


def _rounding_floors(
    ref: torch.Tensor, dtype: torch.dtype, factor: float, logit_noise: torch.Tensor | None
) -> tuple[float, float]:
    """(max, mean) rounding bound of the reference in ``dtype`` (plus logit noise), times ``factor``."""
    mask = torch.isfinite(ref)
    if not mask.any():
        return 0.0, 0.0
    bound = half_ulp(ref[mask], dtype)
    if logit_noise is not None:
        bound = bound + logit_noise[mask]
    return factor * float(bound.max()), factor * float(bound.mean())


def _stats(
    name: str,
    kernel: torch.Tensor,
    controls: list[torch.Tensor],
    ref: torch.Tensor,
    dtype: torch.dtype,
    tol: Tolerance,
    logit_noise: torch.Tensor | None = None,
) -> tuple[ErrorStats, torch.Tensor]:
    mask = torch.isfinite(ref)
    err = (kernel.to(torch.float64) - ref).abs()
    err = torch.where(torch.isnan(err), float("inf"), err)
    ctrl = torch.stack([(c.to(torch.float64) - ref).abs() for c in controls]).amax(0)
    e, c = err[mask], ctrl[mask]
    if not bool(torch.isfinite(c).all()):
        # the plain computation in the kernel's dtype overflows where the reference is finite: no
        # limit can be derived, and a NaN limit would pass anything (every comparison is False)
        raise CaseError(
            f"{name}: the case's values overflow {dtype}: the plain {dtype} computation is not finite on "
            f"{int((~torch.isfinite(c)).sum())} elements where the float64 reference is, so no kernel can be judged on it"
        )
    floor, mean_floor = _rounding_floors(ref, dtype, tol.floor_factor, logit_noise)
    ctrl_max = float(c.max()) if c.numel() else 0.0
    ctrl_mean = float(c.mean()) if c.numel() else 0.0
    limit_max = tol.max_ratio * ctrl_max + floor
    limit_mean = tol.mean_ratio * ctrl_mean + mean_floor
    stats = ErrorStats(
        name=name,
        max_error=float(e.max()) if e.numel() else 0.0,
        mean_error=float(e.mean()) if e.numel() else 0.0,
        control_max_error=ctrl_max,
        control_mean_error=ctrl_mean,
        floor=floor,
        numel=int(e.numel()),
        mismatches=int((e > limit_max).sum()),
        limit_max=limit_max,
        limit_mean=limit_mean,
    )
    return stats, torch.where(mask, err, torch.zeros_like(err))


def compare(
    case: Case,
    *,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    ref: Reference,
    controls: list[tuple[torch.Tensor, torch.Tensor]],
    tolerance: Tolerance = Tolerance(),
) -> Verdict:
    """Judge a kernel's ``out`` (and natural-log ``lse`` if it returns one) against the reference.

    ``controls`` are plain same-precision computations (out, lse); their elementwise worst error
    is the control error (flash-attn keeps two, with the scaling reordered).
    """
    ref_out, ref_lse = ref.out, ref.lse
    failures: list[str] = []
    heads, total_q = case.heads, case.layout.total_q
    out_dtype = getattr(torch, case.options.q_dtype)
    want = (total_q, heads.num_qo_heads, heads.head_dim_vo)
    if tuple(out.shape) != want:
        return Verdict(False, [f"out has shape {tuple(out.shape)}, expected {want}"])
    if out.dtype != out_dtype:
        failures.append(f"out dtype is {out.dtype}, expected {out_dtype}")
    out = out.to(ref_out.device)
    empty_rows = torch.isinf(ref_lse)  # [total_q, Hq]: no key to attend
    bad = ~torch.isfinite(out)
    if bad.any():
        failures.append(f"out has {int(bad.sum())} non-finite elements (NaN {int(torch.isnan(out).sum())})")
    nonzero_empty = (out != 0).any(-1) & empty_rows
    if nonzero_empty.any():
        failures.append(f"{int(nonzero_empty.sum())} empty rows (no key to attend) are not exactly 0")
    out_stats, error = _stats("out", out, [c[0] for c in controls], ref_out, out_dtype, tolerance, ref.logit_noise)
    if out_stats.max_error > out_stats.limit_max:
        failures.append(
            f"out max error {out_stats.max_error:.3g} > {out_stats.limit_max:.3g} allowed "
            f"({tolerance.max_ratio:g} x control {out_stats.control_max_error:.3g} + floor {out_stats.floor:.3g}); "
            f"{out_stats.mismatches} / {out_stats.numel} elements mismatch"
        )
    elif out_stats.mean_error > out_stats.limit_mean:
        failures.append(
            f"out mean error {out_stats.mean_error:.3g} > {out_stats.limit_mean:.3g} allowed "
            f"({tolerance.mean_ratio:g} x control mean {out_stats.control_mean_error:.3g} + mean floor)"
        )
    lse_stats, lse_error = None, None
    if lse is not None:
        lse = lse.to(ref_lse.device)
        if tuple(lse.shape) != (total_q, heads.num_qo_heads):
            failures.append(f"lse has shape {tuple(lse.shape)}, expected {(total_q, heads.num_qo_heads)}")
        else:
            lse64 = lse.to(torch.float64)
            wrong_empty = empty_rows & ~(lse64 == float("-inf"))
            if wrong_empty.any():
                sample = lse64[wrong_empty][:3].tolist()
                failures.append(f"{int(wrong_empty.sum())} empty rows have lse {sample}, expected -inf")
            bad_lse = ~empty_rows & ~torch.isfinite(lse64)
            if bad_lse.any():
                failures.append(f"lse has {int(bad_lse.sum())} non-finite values on rows with keys")
            lse_stats, lse_error = _stats("lse", lse64, [c[1] for c in controls], ref_lse, torch.float32, tolerance)
            lse_error = torch.where(wrong_empty, float("inf"), lse_error)
            if lse_stats.max_error > lse_stats.limit_max:
                failures.append(
                    f"lse max error {lse_stats.max_error:.3g} > {lse_stats.limit_max:.3g} allowed "
                    f"({lse_stats.mismatches} / {lse_stats.numel} mismatch)"
                )
    return Verdict(not failures, failures, out_stats, lse_stats, error, lse_error)
