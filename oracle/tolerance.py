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

import functools
import math
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


class _Reads:
    """0-d float64 device tensors, read back to the host together: one copy, so one stream sync on
    CUDA, instead of one per ``float(...)``. ``add`` returns a slot; ``value(slot)`` reads all once."""

    def __init__(self) -> None:
        self._pending: list[torch.Tensor] = []
        self._values: list[float] | None = None

    def add(self, t: torch.Tensor) -> int:
        assert self._values is None, "a read was added after the values came back"
        self._pending.append(t.to(torch.float64))
        return len(self._pending) - 1

    def count(self, mask: torch.Tensor) -> int:
        """A slot holding how many elements of ``mask`` are True (exact below 2**53)."""
        return self.add(mask.sum(dtype=torch.float64))

    def value(self, slot: int) -> float:
        if self._values is None:
            self._values = torch.stack(self._pending).tolist() if self._pending else []
        return self._values[slot]


def _finite_elements(ref: torch.Tensor) -> torch.Tensor:
    """The flat indices of ``ref``'s finite elements, in logical order (one wait on CUDA)."""
    return torch.isfinite(ref).reshape(-1).nonzero().squeeze(1)


class _Pending:
    """``_stats``' reductions of one output, queued on a ``_Reads``; ``finish`` makes the stats.

    The kernel's error, the control error and the rounding bound are reduced over the elements
    where the reference is finite, in their logical order, as ``x[mask].max()`` / ``.mean()``
    would: over every element when the reference's sum is finite (then so is each element), else
    over the finite ones, selected with one ``nonzero`` (``rows``)."""

    def __init__(
        self, name: str, kernel: torch.Tensor, controls: list[torch.Tensor], ref: torch.Tensor, dtype: torch.dtype,
        logit_noise: torch.Tensor | None, reads: _Reads, rows: torch.Tensor | None = None,
    ) -> None:
        self.name, self.kernel, self.controls, self.ref, self.dtype, self.logit_noise = name, kernel, controls, ref, dtype, logit_noise
        self.reads, self.rows = reads, rows
        self.err = (kernel.to(torch.float64) - ref).abs().nan_to_num_(nan=float("inf"), posinf=float("inf"))
        ctrl = [(c.to(torch.float64) - ref).abs() for c in controls]
        self.ctrl = functools.reduce(torch.maximum, ctrl[1:], ctrl[0])  # NaN-propagating, as amax
        self.numel = ref.numel() if rows is None else rows.numel()
        self.all_finite = reads.add(ref.sum()) if rows is None else None  # NaN or inf if any element is
        if self.numel == 0:
            return
        e, c = self._pick(self.err), self._pick(self.ctrl)
        bound = half_ulp(self._pick(ref), dtype)
        if logit_noise is not None:
            bound = bound + self._pick(logit_noise)
        self.slots = [reads.add(x) for x in (e.max(), e.mean(), c.max(), c.mean(), bound.max(), bound.mean())]
        self.e = e

    def _pick(self, x: torch.Tensor) -> torch.Tensor:
        """The elements the stats are over, flat in logical order."""
        return x.reshape(-1) if self.rows is None else x.reshape(-1).index_select(0, self.rows)

    def finish(self, tol: Tolerance) -> tuple[ErrorStats, torch.Tensor]:
        """The stats and the error tensor (0 where the reference is not finite)."""
        if self.all_finite is not None and not math.isfinite(self.reads.value(self.all_finite)):
            rows = _finite_elements(self.ref)
            exact = _Pending(self.name, self.kernel, self.controls, self.ref, self.dtype, self.logit_noise, _Reads(), rows)
            return exact.finish(tol)
        if self.numel == 0:
            max_error = mean_error = ctrl_max = ctrl_mean = floor = mean_floor = 0.0
        else:
            max_error, mean_error, ctrl_max, ctrl_mean, bound_max, bound_mean = (self.reads.value(s) for s in self.slots)
            if not math.isfinite(ctrl_max):  # max propagates NaN and inf: some control element is not finite
                # the plain computation in the kernel's dtype overflows where the reference is finite: no
                # limit can be derived, and a NaN limit would pass anything (every comparison is False)
                raise CaseError(
                    f"{self.name}: the case's values overflow {self.dtype}: the plain {self.dtype} computation is not finite on "
                    f"{int((~torch.isfinite(self._pick(self.ctrl))).sum())} elements where the float64 reference is, "
                    "so no kernel can be judged on it"
                )
            floor, mean_floor = tol.floor_factor * bound_max, tol.floor_factor * bound_mean
        limit_max = tol.max_ratio * ctrl_max + floor
        limit_mean = tol.mean_ratio * ctrl_mean + mean_floor
        stats = ErrorStats(
            name=self.name,
            max_error=max_error,
            mean_error=mean_error,
            control_max_error=ctrl_max,
            control_mean_error=ctrl_mean,
            floor=floor,
            numel=self.numel,
            # no element exceeds the limit unless the largest does: counted only then
            mismatches=int((self.e > limit_max).sum()) if max_error > limit_max else 0,
            limit_max=limit_max,
            limit_mean=limit_mean,
        )
        if self.rows is None:
            return stats, self.err
        return stats, torch.where(torch.isfinite(self.ref), self.err, 0.0)


def compare(
    case: Case,
    *,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    ref: Reference,
    controls: list[tuple[torch.Tensor, torch.Tensor]],
    tolerance: Tolerance = Tolerance(),
    empty_rows: bool | None = None,
    lse_noise: torch.Tensor | None = None,
) -> Verdict:
    """Judge a kernel's ``out`` (and natural-log ``lse`` if it returns one) against the reference.

    ``controls`` are plain same-precision computations (out, lse); their elementwise worst error
    is the control error (flash-attn keeps two, with the scaling reordered). ``empty_rows``: whether
    some row attends no key, when the caller knows it on the host (``Plan.empty_rows``): False skips
    the empty-row checks (there is nothing for them to find), True reduces the LSE over its finite
    reference rows at once instead of after finding that some are not. The verdict is the same.
    ``lse_noise`` [total_q, Hq] widens the LSE's floor where the kernel's logits are less precise than
    float32 (an fp8 tensor-core dot: ``pa_oracle.oracle.reference.fp8_logit_noise``).
    """
    ref_out, ref_lse = ref.out, ref.lse
    failures: list[str] = []
    heads, total_q = case.heads, case.layout.total_q
    out_dtype = getattr(torch, case.options.out_dtype)
    want = (total_q, heads.num_qo_heads, heads.head_dim_vo)
    if tuple(out.shape) != want:
        return Verdict(False, [f"out has shape {tuple(out.shape)}, expected {want}"])
    if out.dtype != out_dtype:
        failures.append(f"out dtype is {out.dtype}, expected {out_dtype}")
    out = out.to(ref_out.device)
    reads = _Reads()  # every scalar below comes back in one copy
    # [total_q, Hq]: no key to attend; None when the host knows no row is empty (nothing for the checks to find)
    empty = None if empty_rows is False else torch.isinf(ref_lse)
    finite_out = reads.count(torch.isfinite(out))
    nonzero_empty = None if empty is None else reads.count((out != 0).any(-1) & empty)
    out_pending = _Pending("out", out, [c[0] for c in controls], ref_out, out_dtype, ref.logit_noise, reads)
    lse64, wrong_empties = None, None
    if lse is not None:
        lse = lse.to(ref_lse.device)
        if tuple(lse.shape) == (total_q, heads.num_qo_heads):
            lse64 = lse.to(torch.float64)
            if empty is None:
                bad_lse = reads.count(~torch.isfinite(lse64))
            else:
                wrong_empty = empty & ~(lse64 == float("-inf"))
                wrong_empties, bad_lse = reads.count(wrong_empty), reads.count(~empty & ~torch.isfinite(lse64))
            # some rows known to be empty: the finite reference rows, selected at once (one wait, not two)
            rows = _finite_elements(ref_lse) if empty_rows else None
            lse_pending = _Pending("lse", lse64, [c[1] for c in controls], ref_lse, torch.float32, lse_noise, reads, rows)
    if reads.value(finite_out) < out.numel():
        failures.append(f"out has {out.numel() - int(reads.value(finite_out))} non-finite elements (NaN {int(torch.isnan(out).sum())})")
    if nonzero_empty is not None and reads.value(nonzero_empty):
        failures.append(f"{int(reads.value(nonzero_empty))} empty rows (no key to attend) are not exactly 0")
    out_stats, error = out_pending.finish(tolerance)
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
    if lse is not None and lse64 is None:
        failures.append(f"lse has shape {tuple(lse.shape)}, expected {(total_q, heads.num_qo_heads)}")
    elif lse64 is not None:
        wrong = wrong_empties is not None and reads.value(wrong_empties)
        if wrong:
            sample = lse64[wrong_empty][:3].tolist()
            failures.append(f"{int(reads.value(wrong_empties))} empty rows have lse {sample}, expected -inf")
        if reads.value(bad_lse):
            failures.append(f"lse has {int(reads.value(bad_lse))} non-finite values on rows with keys")
        lse_stats, lse_error = lse_pending.finish(tolerance)
        if wrong:
            lse_error = torch.where(wrong_empty, float("inf"), lse_error)
        if lse_stats.max_error > lse_stats.limit_max:
            failures.append(
                f"lse max error {lse_stats.max_error:.3g} > {lse_stats.limit_max:.3g} allowed "
                f"({lse_stats.mismatches} / {lse_stats.numel} mismatch)"
            )
    return Verdict(not failures, failures, out_stats, lse_stats, error, lse_error)
