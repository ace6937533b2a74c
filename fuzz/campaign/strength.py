"""How strong a failing verdict is: per failing quantity (``out``, ``lse``) its error over the error allowed, and the
rule a reduction of a finding must keep (``required_ratio``).

A finding's strength is what tells a bug from rounding: an output at 1,800x the allowed error is a bug, one at
1.00x is noise a maintainer closes. A reduction that reproduces only the kind of failure (``minimize.Signature``)
may trade one for the other: issue 43's output at 1,804x became an LSE at 1.00x. So a reduction keeps the failure
only if it still fails each quantity the original fails strongly (``kept``: its *lead*, the one furthest beyond its
limit, and any other at ``FLOOR_RATIO`` or more) by at least ``required_ratio`` of the original's ratio there: a
tenth of it (``KEEP_FRACTION``; a reduction that loses more has changed what is wrong, not only how big the case
is), and never less than twice the allowed error (``FLOOR_RATIO``), unless the original itself was weaker than
that (then no weaker than the original).

The ratio is the one the verdict line states: its error and allowed error at 3 significant digits
(``out max error 0.000332 > 1.84e-07 allowed`` is 1,804x), as ``findings.finding_ratio`` reads it, so every
report that quotes the numbers gives the same ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pa_oracle.fuzz.campaign.findings import ratio_words
from pa_oracle.oracle.tolerance import ErrorStats, Verdict

KEEP_FRACTION = 0.1  # a reduction keeps at least this fraction of the original's ratio on its lead quantity ...
FLOOR_RATIO = 2.0  # ... and at least twice the allowed error (or the original's ratio, when that is lower)
QUANTITIES = {"out": "output", "lse": "LSE"}  # how a title names them


@dataclass(frozen=True)
class Strength:
    """One failing quantity of a verdict: its error statistic ("max"; "mean" when only the output's mean fails)
    beyond the error allowed."""

    quantity: str  # "out" or "lse"
    statistic: str  # "max" or "mean"
    error: float
    allowed: float

    @property
    def ratio(self) -> float:
        """Error over allowed error as the verdict line states them (3 significant digits)."""
        error, allowed = float(f"{self.error:.3g}"), float(f"{self.allowed:.3g}")
        return error / allowed if allowed > 0 else math.inf if error > 0 else 0.0

    def describe(self) -> str:
        """``out max error 0.000332 > 1.84e-07 allowed (1,804x)``: the verdict line's numbers and their ratio."""
        return f"{self.quantity} {self.statistic} error {self.error:.3g} > {self.allowed:.3g} allowed ({ratio_words(self.ratio)}x)"


def strengths(verdict: Verdict | None) -> tuple[Strength, ...]:
    """The failing quantities of ``verdict`` (out first), each with its error beyond its limit; () for a passing
    verdict, a verdict without error statistics (a contract breach, a wrong shape) or none (a crash)."""
    if verdict is None or verdict.passed:
        return ()
    found = []
    if (out := verdict.out) is not None and out.numel:
        if out.max_error > out.limit_max:
            found.append(Strength("out", "max", out.max_error, out.limit_max))
        elif out.mean_error > out.limit_mean:
            found.append(Strength("out", "mean", out.mean_error, out.limit_mean))
    if (lse := verdict.lse) is not None and lse.numel and lse.max_error > lse.limit_max:
        found.append(Strength("lse", "max", lse.max_error, lse.limit_max))
    return tuple(found)


def lead(found: tuple[Strength, ...]) -> Strength | None:
    """The quantity furthest beyond its limit (the output on a tie), or None."""
    return max(found, key=lambda s: s.ratio, default=None)


def required_ratio(ratio: float) -> float:
    """The least ratio a reduction of a failure at ``ratio`` must keep on the same quantity (module docstring)."""
    return min(ratio, max(ratio * KEEP_FRACTION, FLOOR_RATIO))


def kept(original: tuple[Strength, ...]) -> tuple[Strength, ...]:
    """The quantities of ``original`` a reduction must keep failing: its lead, and any other it fails by at least
    ``FLOOR_RATIO`` (an output and an LSE both far off stay both off)."""
    first = lead(original)
    return tuple(s for s in original if s is first or s.ratio >= FLOOR_RATIO)


def keeps(original: tuple[Strength, ...], candidate: tuple[Strength, ...]) -> bool:
    """``candidate`` fails each quantity ``kept`` of ``original`` by at least ``required_ratio`` of its ratio there
    (True when the original has no error statistics to keep)."""
    theirs = {s.quantity: s.ratio for s in candidate}
    return all(theirs.get(s.quantity, 0.0) >= required_ratio(s.ratio) for s in kept(original))


def limits(verdict: Verdict) -> dict[str, float] | None:
    """The judge's error limits of the case a verdict judged (``out_max``, ``out_mean``, ``lse_max``: what
    ``repro.py`` checks), or None when the verdict has no error statistics."""
    out, lse = verdict.out, verdict.lse
    if out is None:
        return None
    found = {"out_max": out.limit_max, "out_mean": out.limit_mean}
    if isinstance(lse, ErrorStats):
        found["lse_max"] = lse.limit_max
    return found
