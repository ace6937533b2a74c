"""Exact statistics for the accuracy gates, from the standard libraries: McNemar's exact test on
paired per-question outcomes (``statsmodels``' ``mcnemar(exact=True)``, one-sided from
``scipy.stats.binomtest``), Wilson score bounds on one accuracy (``proportion_confint(method=
"wilson")``), and the accuracy drop each check detects (power from the binomial distribution,
``scipy.stats.binom``; no normal approximation in the tests themselves). scipy and statsmodels
are imported when a function first needs them (``pip install 'paged-attention-oracle[eval]'``).

Conventions: a *loss* is a question the reference answers right and the backend wrong (McNemar's
``b``), a *win* the reverse (``c``). Rates are fractions of all questions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import inf
from typing import Any

_NEGLIGIBLE = 1e-15  # a count this improbable is left out of a power sum


def _binom() -> Any:
    from scipy.stats import binom  # type: ignore[import-untyped]  # scipy ships no type information (scipy-stubs is not a dependency)

    return binom


# ---------------------------------------------------------------- binomial distribution
def _check_count(k: int, n: int) -> None:
    if n < 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")


def _check_rate(name: str, p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {p}")


def binomial_pmf(k: int, n: int, p: float) -> float:
    """P(X = k) for X ~ Binomial(n, p)."""
    _check_count(k, n)
    _check_rate("p", p)
    return float(_binom().pmf(k, n, p))


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p); k may lie outside [0, n]."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return float(_binom().cdf(k, n, p))


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p); k may lie outside [0, n]."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return float(_binom().sf(k - 1, n, p))


# ---------------------------------------------------------------- McNemar
@dataclass(frozen=True)
class McNemar:
    """Exact McNemar test on the discordant pairs: under H0 ``losses ~ Binomial(losses + wins, 1/2)``."""

    losses: int  # b: reference right, backend wrong
    wins: int  # c: backend right, reference wrong
    p_two_sided: float  # min(1, 2 * the smaller tail): statsmodels' mcnemar(exact=True)
    p_backend_worse: float  # one-sided: P(X >= losses), H1 "the backend loses more than it wins"


def mcnemar_exact(losses: int, wins: int) -> McNemar:
    """Exact McNemar test: two-sided from ``statsmodels``' ``mcnemar(exact=True)``, one-sided
    ``scipy.stats.binomtest(losses, losses + wins, 0.5, alternative="greater")``; no discordant
    pair gives p = 1 both ways."""
    if losses < 0 or wins < 0:
        raise ValueError(f"discordant counts must be >= 0, got losses={losses}, wins={wins}")
    if losses + wins == 0:
        return McNemar(losses, wins, 1.0, 1.0)
    from scipy.stats import binomtest  # type: ignore[import-untyped]  # scipy ships no type information (scipy-stubs is not a dependency)
    from statsmodels.stats.contingency_tables import mcnemar  # type: ignore[import-untyped]  # statsmodels ships no py.typed

    two_sided = float(mcnemar([[0, losses], [wins, 0]], exact=True).pvalue)
    worse = float(binomtest(losses, losses + wins, 0.5, alternative="greater").pvalue)
    return McNemar(losses, wins, min(1.0, two_sided), min(1.0, worse))


def _critical_losses(discordant: Any, alpha: float) -> Any:
    """Smallest loss count the one-sided exact test rejects at ``alpha`` among ``discordant``
    pairs (``discordant + 1`` when none is rejected): one past the smallest k with P(X > k) <= alpha
    (``binom.isf``), element-wise on an array of pair counts."""
    return _binom().isf(alpha, discordant, 0.5) + 1


def mcnemar_power(n: int, *, loss_rate: float, win_rate: float, alpha: float = 0.05) -> float:
    """Probability that the one-sided exact McNemar test at ``alpha`` says "backend worse" when each
    of ``n`` questions is independently a loss with probability ``loss_rate`` and a win with
    ``win_rate`` (exact: a sum over the number of discordant pairs, skipping counts whose
    probability is below 1e-15)."""
    import numpy as np

    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    _check_rate("loss_rate", loss_rate)
    _check_rate("win_rate", win_rate)
    if loss_rate + win_rate > 1:
        raise ValueError(f"loss_rate + win_rate must be <= 1, got {loss_rate} + {win_rate}")
    discordance = loss_rate + win_rate
    if discordance == 0:
        return 0.0
    share = loss_rate / discordance
    binom = _binom()
    discordant = np.arange(n + 1)
    weight = binom.pmf(discordant, n, discordance)
    kept = weight > _NEGLIGIBLE
    discordant, weight = discordant[kept], weight[kept]
    rejected = binom.sf(_critical_losses(discordant, alpha) - 1, discordant, share)  # P(X >= critical)
    return min(float(np.sum(weight * rejected)), 1.0)


def _smallest_drop(power_at: Callable[[float], float], high: float, target: float) -> float:
    """Smallest drop in [0, high] whose power reaches ``target`` (power rises with the drop):
    doubling from 1/1024 to bracket it, then bisection to 1e-5; ``inf`` when even ``high`` falls
    short. Small drops first: large ones mean many discordant pairs, the slow part of the sum."""
    if not 0 < target < 1:
        raise ValueError(f"power must lie in (0, 1), got {target}")
    if power_at(0.0) >= target:
        return 0.0
    low, step = 0.0, 1 / 1024
    while step < high and power_at(step) < target:
        low, step = step, 2 * step
    if step >= high:
        if power_at(high) < target:
            return inf
        step = high
    high = step
    while high - low > 1e-5:
        mid = (low + high) / 2
        low, high = (low, mid) if power_at(mid) >= target else (mid, high)
    return high


def mcnemar_detectable_drop(
    n: int, *, baseline: float, discordance: float, alpha: float = 0.05, power: float = 0.8
) -> float:
    """The accuracy drop (fraction of questions) that the one-sided exact McNemar test at ``alpha``
    detects with probability ``power``, when a correct backend would flip ``discordance`` of the
    questions each way (numerical noise: ``win_rate = discordance``, ``loss_rate = discordance +
    drop``) and the reference answers ``baseline`` of them right (a loss needs a right answer to
    lose: ``loss_rate <= baseline``). ``inf`` if no possible drop reaches that power."""
    _check_rate("baseline", baseline)
    if not 0 <= discordance <= min(baseline, 1 - baseline):
        raise ValueError(f"discordance must lie in [0, min(baseline, 1 - baseline)], got {discordance}")
    return _smallest_drop(
        lambda drop: mcnemar_power(n, loss_rate=discordance + drop, win_rate=discordance, alpha=alpha),
        baseline - discordance,
        power,
    )


# ---------------------------------------------------------------- Wilson score bounds
def _wilson(successes: Any, n: int, tail: float) -> tuple[Any, Any]:
    """The Wilson score interval with ``tail`` probability on each side (statsmodels), element-wise."""
    from statsmodels.stats.proportion import proportion_confint  # type: ignore[import-untyped]  # statsmodels ships no py.typed

    if not 0 < tail < 0.5:
        raise ValueError(f"tail probability must lie in (0, 0.5), got {tail}")
    if n == 0:
        raise ValueError("a Wilson interval needs at least one trial")
    return proportion_confint(successes, n, alpha=2 * tail, method="wilson")


def wilson_interval(successes: int, n: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Wilson score interval (no continuity correction) for ``successes / n``."""
    _check_count(successes, n)
    low, high = _wilson(successes, n, (1 - confidence) / 2)
    return max(0.0, float(low)), min(1.0, float(high))


def wilson_lower_bound(successes: int, n: int, *, alpha: float = 0.05) -> float:
    """One-sided Wilson lower bound at level ``1 - alpha`` (the lower end of the two-sided
    ``1 - 2 alpha`` interval)."""
    _check_count(successes, n)
    return max(0.0, float(_wilson(successes, n, alpha)[0]))


def _largest_failing_count(n: int, threshold: float, alpha: float) -> int:
    """Largest correct count whose Wilson lower bound lies below ``threshold`` (-1 if none);
    the bound rises with the count, so the check fails exactly on counts 0..this one."""
    import numpy as np

    if n == 0:
        return -1
    bounds = np.maximum(0.0, _wilson(np.arange(n + 1), n, alpha)[0])
    passing = np.flatnonzero(bounds >= threshold)
    return int(passing[0]) - 1 if passing.size else n


def wilson_check_power(n: int, *, accuracy: float, expected: float, margin: float, alpha: float = 0.05) -> float:
    """Probability that the check "Wilson lower bound < expected - margin" fails a backend whose true
    accuracy is ``accuracy`` on ``n`` questions (at ``accuracy == expected``: its false-alarm rate)."""
    _check_rate("accuracy", accuracy)
    return binomial_cdf(_largest_failing_count(n, expected - margin, alpha), n, accuracy)


def wilson_margin(n: int, *, expected: float, alpha: float = 0.05) -> float:
    """The smallest margin for which the Wilson check fails a backend at exactly the expected
    accuracy with probability <= ``alpha`` (binomial sampling of ``n`` questions)."""
    import numpy as np

    _check_rate("expected", expected)
    # largest count that may fail: P(X <= tolerated | expected) <= alpha (-1: not even 0 may)
    tolerated = int(np.searchsorted(_binom().cdf(np.arange(n + 1), n, expected), alpha, side="right")) - 1
    if tolerated >= n:
        return 0.0
    # threshold = the next count's bound: that count passes, every count up to `tolerated` fails
    return max(0.0, expected - wilson_lower_bound(tolerated + 1, n, alpha=alpha))


def wilson_detectable_drop(n: int, *, expected: float, margin: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The accuracy drop below ``expected`` that the Wilson check fails with probability ``power``."""
    failing = _largest_failing_count(n, expected - margin, alpha)
    return _smallest_drop(lambda drop: binomial_cdf(failing, n, max(0.0, expected - drop)), expected, power)


def ratio_rule_detectable_drop(n: int, *, expected: float, ratio: float = 0.92, power: float = 0.8) -> float:
    """The drop that a plain threshold ``measured >= ratio * expected`` (vLLM's GSM8k rule) catches
    with probability ``power`` on ``n`` questions."""
    failing = next((k - 1 for k in range(n + 1) if k / n >= ratio * expected), n)
    return _smallest_drop(lambda drop: binomial_cdf(failing, n, max(0.0, expected - drop)), expected, power)
