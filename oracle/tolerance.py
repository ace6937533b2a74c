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

**RoPE: the rotated operands a kernel is entitled to round** (issue 30). A RoPE kernel attends with q
and k it rotated itself, and the rotation is its own arithmetic. FlashInfer's fa2 prefill
(``include/flashinfer/attention/prefill.cuh``: ``q_smem_inplace_apply_rotary`` and
``k_smem_inplace_apply_rotary``, through ``q_frag_apply_llama_rope`` / ``k_frag_apply_llama_rope``) loads
the 16-bit fragments from shared memory, rotates them in float32 by ``__sincosf(float(p) * freq)`` with
``freq = rope_rcp_scale * __powf(rope_rcp_theta, 2 i / head_dim)`` (``compute_rope_freq``), assigns the
result back to the input dtype and stores it to shared memory before the MMA (``k_smem_inplace_apply_rotary``
asserts a 16-bit K). Its decode (``include/flashinfer/pos_enc.cuh``: ``vec_apply_llama_rope``) rotates in
float32 registers and keeps them; vLLM's rotary cache also takes ``cos``/``sin`` of float32 ``p * inv_freq``.
So a correct kernel's logits are dot products of operands that differ from the exactly rotated ones by
(a) rounding to the input dtype (half an ulp: ``2^-9`` relative in bf16) and (b) the float32 angle, which
errs by up to half an ulp of ``p * freq``, about ``p * 2^-24`` rad at position ``p``: a rotation error that
grows with the position, which float32 operands alone (``2^-24`` relative) do not.

The plain control rotates in float64 and rounds the result to ``d``, so it holds (a), but then it rounds
every logit to ``d`` too, and on a row with one dominant key the two roundings may cancel: on
``flashinfer-prefill-fa2-rope`` case 321f681eeb76 (bf16, ``outliers``) its LSE error was 0.0036 where a kernel
rounding as FlashInfer does errs by 0.0171 (the H200 measured the same, so the limit 0.0108 failed it).
It never holds (b). So a RoPE case has RoPE controls (``pa_oracle.oracle.reference.rope_control``,
``Reference.rope_control``): the float64 attention of q and k rotated as FlashInfer rotates them
(``pa_oracle.oracle.rope.kernel_rotated``: float32 angles and arithmetic), stored in the input dtype (``R``;
an fp8 input stays in float32: no kernel stores a rotation in fp8) or kept in float32 (``A``, the angles'
part alone), at the case's own positions (``Case.positions``: a draft tree's ``prefix + depth``) as the
reference and the plain control are. Their attention is exact, so their errors are what those operands alone cost, not a draw of
two roundings that may cancel. A correct kernel's result is, to first order, the exact one moved by its
operands' rounding and by its own arithmetic's (what the plain control measures). Its operands' rounding:

* storing a rotation in a 16-bit dtype rounds a near-exact value, so every kernel that rotates in float32 or
  float64 and stores gets the same bits as ``R`` (but where the exact value lies within the rotation's own
  error, a few float32 ulps plus the angle's, of a rounding midpoint), and one that keeps float32 gets none
  of it: its result lies near the reference or near ``R`` (a kernel storing only one of q and k moves part
  of the way, but not always between them: its two parts may differ in sign; the limits' slack covers it);
* the float32 angles' rounding depends on how a kernel computes its frequencies and ``sin``/``cos``
  (``__powf``, ``1 / theta ** x``, ``__sincosf``): not the same bits, but of ``A``'s size.

So a RoPE case's error is the distance from the nearer of the reference and ``R`` (0 between them), and its
limits add ``A``'s error:

    max err  <= max_ratio  * max|control - ref|  + rope_ratio * max|A - ref|  + floor
    mean err <= mean_ratio * mean|control - ref| + rope_ratio * mean|A - ref| + mean_floor

with ``rope_ratio = 1.5``: another kernel's angles err by a draw of the same size, and ``A``'s error is small
beside the rest unless positions are long (about ``p * 2^-24`` relative against bf16's ``2^-9``). On case
321f681eeb76 the kernel rounding as FlashInfer does lies 4.8e-07 beyond ``R`` and the LSE limit stays 0.0108
(+ 1.5 x 4.7e-07); a planted 0.5% LSE error (0.056 at LSE 11.25) lies 0.056 or 0.039 beyond it either way
round and fails. Widening the limits instead does not keep that: the worse of the controls times 3 gives
0.051, a limit that a -0.5% error (0.039) passes, and ``3 x control + 1.5 x |R - ref|`` passed a +0.5% error on
a drawn bf16 decode-rope case (LSE 14.38, ``R`` 0.0245 below: 0.047 against 0.072); a worst-case bound of the
operands' effect (issue 30's first attempt, 897a7c0) let a 0.5% LSE error through on another. Cases without
RoPE have no RoPE controls: their errors and limits are what they were, bit for bit.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from pa_oracle.oracle.case import Case, CaseError
from pa_oracle.oracle.reference import Reference, half_ulp


ROPE_RATIO = 1.5  # the RoPE angle control's factor (module docstring)


@dataclass(frozen=True)
class Tolerance:
    max_ratio: float = 3.0
    mean_ratio: float = 2.0
    floor_factor: float = 2.0
    rope_ratio: float = ROPE_RATIO  # times the RoPE angle control's error, added (module docstring)

    def __post_init__(self) -> None:
        for name in ("max_ratio", "mean_ratio", "floor_factor", "rope_ratio"):
            if not getattr(self, name) >= 1.0:
                raise ValueError(f"{name} must be >= 1 (a kernel may be at least as accurate as the control)")


@dataclass(frozen=True)
class ErrorStats:
    """Errors of one output (``out`` or ``lse``) against the float64 reference (a RoPE case's: beyond the
    nearer of it and the RoPE control, module docstring)."""

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
    rope_max_error: float | None = None  # the RoPE angle control's (module docstring); None: not a RoPE case
    rope_mean_error: float | None = None

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
    error: torch.Tensor | None = None  # |kernel - ref| of out, [total_q, Hq, Dvo], float64 (NaN -> inf; RoPE: beyond its control)
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


class _Widening(NamedTuple):
    """What widens an output's limit beyond its same-precision controls: ``logit_noise``, a per-element bound
    added to the half ulp of the floor; a RoPE case's controls of this output (``Reference.rope_control``):
    ``rope``, its rotated operands stored in the input dtype (the error is the distance from the nearer of it
    and the reference), and ``rope_angle``, kept in float32 (its error, times ``rope_ratio``, is added)."""

    logit_noise: torch.Tensor | None = None
    rope: torch.Tensor | None = None
    rope_angle: torch.Tensor | None = None


class _Pending:
    """``_stats``' reductions of one output, queued on a ``_Reads``; ``finish`` makes the stats.

    The kernel's error, the control error, the RoPE angle control's error and the rounding bound are reduced
    over the elements where the reference is finite, in their logical order, as ``x[mask].max()`` /
    ``.mean()`` would: over every element when the reference's sum is finite (then so is each element),
    else over the finite ones, selected with one ``nonzero`` (``rows``)."""

    def __init__(
        self, name: str, kernel: torch.Tensor, controls: list[torch.Tensor], ref: torch.Tensor, dtype: torch.dtype,
        widening: _Widening, reads: _Reads, rows: torch.Tensor | None = None,
    ) -> None:
        self.name, self.kernel, self.controls, self.ref, self.dtype, self.widening = name, kernel, controls, ref, dtype, widening
        self.reads, self.rows = reads, rows
        self.err = _beyond(kernel.to(torch.float64), ref, widening.rope).nan_to_num_(nan=float("inf"), posinf=float("inf"))
        ctrl = [(c.to(torch.float64) - ref).abs() for c in controls]
        self.ctrl = functools.reduce(torch.maximum, ctrl[1:], ctrl[0])  # NaN-propagating, as amax
        self.rope = None if widening.rope_angle is None else (widening.rope_angle.to(torch.float64) - ref).abs()
        self.numel = ref.numel() if rows is None else rows.numel()
        self.all_finite = reads.add(ref.sum()) if rows is None else None  # NaN or inf if any element is
        if self.numel == 0:
            return
        e, c = self._pick(self.err), self._pick(self.ctrl)
        bound = half_ulp(self._pick(ref), dtype)
        if widening.logit_noise is not None:
            bound = bound + self._pick(widening.logit_noise)
        reduced = [e.max(), e.mean(), c.max(), c.mean(), bound.max(), bound.mean()]
        if self.rope is not None:
            r = self._pick(self.rope)
            reduced += [r.max(), r.mean()]
        self.slots = [reads.add(x) for x in reduced]
        self.e = e

    def _pick(self, x: torch.Tensor) -> torch.Tensor:
        """The elements the stats are over, flat in logical order."""
        return x.reshape(-1) if self.rows is None else x.reshape(-1).index_select(0, self.rows)

    def _overflow(self, what: str, errors: torch.Tensor) -> CaseError:
        # the computation in the kernel's dtype overflows where the reference is finite: no limit can be
        # derived, and a NaN limit would pass anything (every comparison is False)
        return CaseError(
            f"{self.name}: the case's values overflow {self.dtype}: {what} is not finite on "
            f"{int((~torch.isfinite(self._pick(errors))).sum())} elements where the float64 reference is, "
            "so no kernel can be judged on it"
        )

    def finish(self, tol: Tolerance) -> tuple[ErrorStats, torch.Tensor]:
        """The stats and the error tensor (0 where the reference is not finite)."""
        if self.all_finite is not None and not math.isfinite(self.reads.value(self.all_finite)):
            rows = _finite_elements(self.ref)
            exact = _Pending(self.name, self.kernel, self.controls, self.ref, self.dtype, self.widening, _Reads(), rows)
            return exact.finish(tol)
        rope_max = rope_mean = None
        if self.numel == 0:
            max_error = mean_error = ctrl_max = ctrl_mean = floor = mean_floor = 0.0
            if self.rope is not None:
                rope_max = rope_mean = 0.0
        else:
            max_error, mean_error, ctrl_max, ctrl_mean, bound_max, bound_mean = (self.reads.value(s) for s in self.slots[:6])
            if not math.isfinite(ctrl_max):  # max propagates NaN and inf: some control element is not finite
                raise self._overflow(f"the plain {self.dtype} computation", self.ctrl)
            floor, mean_floor = tol.floor_factor * bound_max, tol.floor_factor * bound_mean
            if self.rope is not None:
                rope_max, rope_mean = (self.reads.value(s) for s in self.slots[6:])
                if not math.isfinite(rope_max):
                    raise self._overflow("the RoPE angle control (operands rotated in float32)", self.rope)
        limit_max = tol.max_ratio * ctrl_max + floor
        limit_mean = tol.mean_ratio * ctrl_mean + mean_floor
        if rope_max is not None and rope_mean is not None:  # a RoPE case: the float32 angles' part, added
            limit_max, limit_mean = limit_max + tol.rope_ratio * rope_max, limit_mean + tol.rope_ratio * rope_mean
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
            rope_max_error=rope_max,
            rope_mean_error=rope_mean,
        )
        if self.rows is None:
            return stats, self.err
        return stats, torch.where(torch.isfinite(self.ref), self.err, 0.0)


def _beyond(kernel: torch.Tensor, ref: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
    """``|kernel - ref|``; for a RoPE case the distance from the nearer of ``ref`` and ``rope`` (the RoPE control
    with its operands stored in the input dtype), 0 between them (module docstring)."""
    if rope is None:
        return (kernel - ref).abs()
    rope = rope.to(torch.float64)
    nearest = torch.minimum(torch.maximum(kernel, torch.minimum(ref, rope)), torch.maximum(ref, rope))
    return (kernel - nearest).abs()


def _rope_note(stats: ErrorStats, tol: Tolerance, *, mean: bool = False) -> str:
    """What a RoPE case's failure message adds ('' for any other case)."""
    error = stats.rope_mean_error if mean else stats.rope_max_error
    if error is None:
        return ""
    return f"; error beyond the RoPE control, limit + {tol.rope_ratio:g} x its angle control{' mean' if mean else ''} {error:.3g}"


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

    Two phases: every reduction is queued on one ``_Reads`` (out's, then lse's), then read back with
    one copy and judged (out's failures, then lse's).
    """
    heads = case.heads
    out_dtype = getattr(torch, case.options.out_dtype)
    want = (case.layout.total_q, heads.num_qo_heads, heads.head_dim_vo)
    if tuple(out.shape) != want:
        return Verdict(False, [f"out has shape {tuple(out.shape)}, expected {want}"])
    failures = [f"out dtype is {out.dtype}, expected {out_dtype}"] if out.dtype != out_dtype else []
    out = out.to(ref.out.device)
    reads = _Reads()  # every scalar below comes back in one copy
    # [total_q, Hq]: no key to attend; None when the host knows no row is empty (nothing for the checks to find)
    empty = None if empty_rows is False else torch.isinf(ref.lse)
    out_queued = _queue_out(out, ref, [c[0] for c in controls], out_dtype, empty, reads)
    lse_queued = None
    if lse is not None:
        lse = lse.to(ref.lse.device)
        if tuple(lse.shape) == (case.layout.total_q, heads.num_qo_heads):
            lse_queued = _queue_lse(lse, ref, [c[1] for c in controls], empty, empty_rows, lse_noise, reads)
    out_failures, out_stats, error = _judge_out(out, out_queued, tolerance, reads)
    failures += out_failures
    lse_stats, lse_error = None, None
    if lse is not None and lse_queued is None:
        failures.append(f"lse has shape {tuple(lse.shape)}, expected {(case.layout.total_q, heads.num_qo_heads)}")
    elif lse_queued is not None:
        lse_failures, lse_stats, lse_error = _judge_lse(lse_queued, tolerance, reads)
        failures += lse_failures
    return Verdict(not failures, failures, out_stats, lse_stats, error, lse_error)


class _OutQueued(NamedTuple):
    """``out``'s reads: the slot of its finite elements' count, of the nonzero empty rows' (None: not
    checked) and its error stats."""

    finite: int
    nonzero_empty: int | None
    pending: _Pending


class _LseQueued(NamedTuple):
    """``lse``'s reads (of the right shape, in float64): ``empties``, the wrong empty rows (an empty row
    whose lse is not -inf) and their count's slot (None: not checked), the slot of the non-finite lse
    on rows with keys and its error stats."""

    lse64: torch.Tensor
    empties: tuple[torch.Tensor, int] | None
    non_finite: int
    pending: _Pending


def _queue_out(
    out: torch.Tensor, ref: Reference, controls: list[torch.Tensor], out_dtype: torch.dtype,
    empty: torch.Tensor | None, reads: _Reads,
) -> _OutQueued:
    """Queue ``out``'s checks: finiteness, exact zeros on empty rows, its error against the controls'."""
    finite = reads.count(torch.isfinite(out))
    nonzero_empty = None if empty is None else reads.count((out != 0).any(-1) & empty)
    rope = ref.rope_control  # a RoPE case's RoPE controls; None otherwise
    widening = _Widening(ref.logit_noise) if rope is None else _Widening(ref.logit_noise, rope.out, rope.angle_out)
    return _OutQueued(finite, nonzero_empty, _Pending("out", out, controls, ref.out, out_dtype, widening, reads))


def _queue_lse(
    lse: torch.Tensor, ref: Reference, controls: list[torch.Tensor], empty: torch.Tensor | None,
    empty_rows: bool | None, lse_noise: torch.Tensor | None, reads: _Reads,
) -> _LseQueued:
    """Queue ``lse``'s checks: -inf exactly on empty rows, finite elsewhere, its error against the controls'."""
    lse64 = lse.to(torch.float64)
    if empty is None:
        empties, non_finite = None, reads.count(~torch.isfinite(lse64))
    else:
        wrong_empty = empty & ~(lse64 == float("-inf"))
        empties = (wrong_empty, reads.count(wrong_empty))
        non_finite = reads.count(~empty & ~torch.isfinite(lse64))
    # some rows known to be empty: the finite reference rows, selected at once (one wait, not two)
    rows = _finite_elements(ref.lse) if empty_rows else None
    rope = ref.rope_control
    widening = _Widening(lse_noise) if rope is None else _Widening(lse_noise, rope.lse, rope.angle_lse)
    return _LseQueued(lse64, empties, non_finite, _Pending("lse", lse64, controls, ref.lse, torch.float32, widening, reads, rows))


def _judge_out(out: torch.Tensor, queued: _OutQueued, tolerance: Tolerance,
               reads: _Reads) -> tuple[list[str], ErrorStats, torch.Tensor]:
    """``out``'s failures, error stats and error tensor, from its reads."""
    failures = []
    if reads.value(queued.finite) < out.numel():
        failures.append(f"out has {out.numel() - int(reads.value(queued.finite))} non-finite elements (NaN {int(torch.isnan(out).sum())})")
    if queued.nonzero_empty is not None and reads.value(queued.nonzero_empty):
        failures.append(f"{int(reads.value(queued.nonzero_empty))} empty rows (no key to attend) are not exactly 0")
    stats, error = queued.pending.finish(tolerance)
    if stats.max_error > stats.limit_max:
        failures.append(
            f"out max error {stats.max_error:.3g} > {stats.limit_max:.3g} allowed "
            f"({tolerance.max_ratio:g} x control {stats.control_max_error:.3g} + floor {stats.floor:.3g}{_rope_note(stats, tolerance)}); "
            f"{stats.mismatches} / {stats.numel} elements mismatch"
        )
    elif stats.mean_error > stats.limit_mean:
        failures.append(
            f"out mean error {stats.mean_error:.3g} > {stats.limit_mean:.3g} allowed "
            f"({tolerance.mean_ratio:g} x control mean {stats.control_mean_error:.3g} + mean floor{_rope_note(stats, tolerance, mean=True)})"
        )
    return failures, stats, error


def _judge_lse(queued: _LseQueued, tolerance: Tolerance, reads: _Reads) -> tuple[list[str], ErrorStats, torch.Tensor]:
    """``lse``'s failures, error stats and error tensor (inf on a wrong empty row), from its reads."""
    failures = []
    wrong_empty = None
    if queued.empties is not None and (wrong := int(reads.value(queued.empties[1]))):
        wrong_empty = queued.empties[0]
        sample = queued.lse64[wrong_empty][:3].tolist()
        failures.append(f"{wrong} empty rows have lse {sample}, expected -inf")
    if reads.value(queued.non_finite):
        failures.append(f"lse has {int(reads.value(queued.non_finite))} non-finite values on rows with keys")
    stats, error = queued.pending.finish(tolerance)
    if wrong_empty is not None:
        error = torch.where(wrong_empty, float("inf"), error)
    if stats.max_error > stats.limit_max:
        failures.append(
            f"lse max error {stats.max_error:.3g} > {stats.limit_max:.3g} allowed "
            f"({stats.mismatches} / {stats.numel} mismatch{_rope_note(stats, tolerance)})"
        )
    return failures, stats, error
