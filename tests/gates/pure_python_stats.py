"""The pure-Python gates/stats.py as it was before scipy and statsmodels replaced it (a verbatim copy):
the reference that tests/gates/test_stats.py checks the library-backed functions against."""

# ruff: noqa
"""Exact statistics for the accuracy gates, in pure Python: McNemar's test on paired per-question
outcomes, Wilson score bounds on one accuracy, and the accuracy drop each check detects (power
from the binomial distribution, no normal approximation in the tests themselves).

Conventions: a *loss* is a question the reference answers right and the backend wrong (McNemar's
``b``), a *win* the reverse (``c``). Rates are fractions of all questions.
"""


from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from math import comb, exp, inf, lgamma, log, log1p, sqrt
from statistics import NormalDist

_NEGLIGIBLE = 1e-15  # a count this improbable is left out of a power sum


# ---------------------------------------------------------------- binomial distribution
def _check_count(k: int, n: int) -> None:
    if n < 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")


def _check_rate(name: str, p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {p}")


def binomial_pmf(k: int, n: int, p: float) -> float:
    """P(X = k) for X ~ Binomial(n, p), in log space (no overflow for n in the thousands)."""
    _check_count(k, n)
    _check_rate("p", p)
    if p in (0.0, 1.0):
        return float(k == (n if p == 1.0 else 0))
    return exp(lgamma(n + 1) - lgamma(k + 1) - lgamma(n - k + 1) + k * log(p) + (n - k) * log1p(-p))


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p); k may lie outside [0, n]."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return min(1.0, sum(binomial_pmf(i, n, p) for i in range(k + 1)))


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p); k may lie outside [0, n]."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return min(1.0, sum(binomial_pmf(i, n, p) for i in range(k, n + 1)))


def half_tail_at_least(k: int, n: int) -> Fraction:
    """P(X >= k) for X ~ Binomial(n, 1/2), exactly (integer arithmetic); k may lie outside [0, n]."""
    if n < 0:
        raise ValueError(f"need n >= 0, got {n}")
    return Fraction(sum(comb(n, i) for i in range(max(k, 0), n + 1)), 2**n)


# ---------------------------------------------------------------- McNemar
@dataclass(frozen=True)
class McNemar:
    """Exact McNemar test on the discordant pairs: under H0 ``losses ~ Binomial(losses + wins, 1/2)``."""

    losses: int  # b: reference right, backend wrong
    wins: int  # c: backend right, reference wrong
    p_two_sided: float  # min(1, 2 * the smaller tail): statsmodels' mcnemar(exact=True)
    p_backend_worse: float  # one-sided: P(X >= losses), H1 "the backend loses more than it wins"


def mcnemar_exact(losses: int, wins: int) -> McNemar:
    """Exact McNemar test; no discordant pair gives p = 1 both ways.

    Equivalent to ``scipy.stats.binomtest(losses, losses + wins, 0.5)`` (two-sided and
    ``alternative="greater"``).
    """
    if losses < 0 or wins < 0:
        raise ValueError(f"discordant counts must be >= 0, got losses={losses}, wins={wins}")
    n = losses + wins
    upper = half_tail_at_least(losses, n)
    lower = 1 - half_tail_at_least(losses + 1, n)
    return McNemar(losses, wins, float(min(Fraction(1), 2 * min(upper, lower))), float(upper))


@lru_cache(maxsize=4096)
def _critical_losses(discordant: int, alpha: Fraction) -> int:
    """Smallest loss count the one-sided exact test rejects at ``alpha`` among ``discordant``
    pairs (``discordant + 1`` when none is rejected)."""
    limit = alpha.numerator * 2**discordant  # P(X >= k) <= alpha  <=>  tail * denominator <= limit
    tail, term = 0, 1  # term = comb(discordant, k), k walking down from the top
    k = discordant
    while k >= 0:
        if (tail + term) * alpha.denominator > limit:
            return k + 1
        tail += term
        term = term * k // (discordant - k + 1)
        k -= 1
    return 0


def mcnemar_power(n: int, *, loss_rate: float, win_rate: float, alpha: float = 0.05) -> float:
    """Probability that the one-sided exact McNemar test at ``alpha`` says "backend worse" when each
    of ``n`` questions is independently a loss with probability ``loss_rate`` and a win with
    ``win_rate`` (exact: a sum over the number of discordant pairs, skipping counts whose
    probability is below 1e-15)."""
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
    alpha_exact = Fraction(alpha)
    power = 0.0
    for d in range(n + 1):
        weight = binomial_pmf(d, n, discordance)
        if weight > _NEGLIGIBLE:
            power += weight * binomial_tail(_critical_losses(d, alpha_exact), d, share)
    return min(power, 1.0)


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
def _z(tail: float) -> float:
    if not 0 < tail < 0.5:
        raise ValueError(f"tail probability must lie in (0, 0.5), got {tail}")
    return NormalDist().inv_cdf(1 - tail)


def _wilson(successes: int, n: int, z: float) -> tuple[float, float]:
    _check_count(successes, n)
    if n == 0:
        raise ValueError("a Wilson interval needs at least one trial")
    p_hat, z2 = successes / n, z * z
    center = (p_hat + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * sqrt(p_hat * (1 - p_hat) / n + z2 / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def wilson_interval(successes: int, n: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Wilson score interval (no continuity correction) for ``successes / n``."""
    return _wilson(successes, n, _z((1 - confidence) / 2))


def wilson_lower_bound(successes: int, n: int, *, alpha: float = 0.05) -> float:
    """One-sided Wilson lower bound at level ``1 - alpha`` (the lower end of the two-sided
    ``1 - 2 alpha`` interval)."""
    return _wilson(successes, n, _z(alpha))[0]


def _largest_failing_count(n: int, threshold: float, alpha: float) -> int:
    """Largest correct count whose Wilson lower bound lies below ``threshold`` (-1 if none);
    the bound rises with the count, so the check fails exactly on counts 0..this one."""
    failing = -1
    for k in range(n + 1):
        if wilson_lower_bound(k, n, alpha=alpha) >= threshold:
            break
        failing = k
    return failing


def wilson_check_power(n: int, *, accuracy: float, expected: float, margin: float, alpha: float = 0.05) -> float:
    """Probability that the check "Wilson lower bound < expected - margin" fails a backend whose true
    accuracy is ``accuracy`` on ``n`` questions (at ``accuracy == expected``: its false-alarm rate)."""
    _check_rate("accuracy", accuracy)
    return binomial_cdf(_largest_failing_count(n, expected - margin, alpha), n, accuracy)


def wilson_margin(n: int, *, expected: float, alpha: float = 0.05) -> float:
    """The smallest margin for which the Wilson check fails a backend at exactly the expected
    accuracy with probability <= ``alpha`` (binomial sampling of ``n`` questions)."""
    _check_rate("expected", expected)
    tolerated, cdf = -1, 0.0  # largest count that may fail: P(X <= tolerated | expected) <= alpha
    while tolerated < n and cdf + binomial_pmf(tolerated + 1, n, expected) <= alpha:
        tolerated += 1
        cdf += binomial_pmf(tolerated, n, expected)
    if tolerated == n:
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
