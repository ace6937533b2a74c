import math

import pytest
from pa_oracle.gates.stats import (
    binomial_cdf,
    binomial_pmf,
    mcnemar_detectable_drop,
    mcnemar_exact,
    mcnemar_power,
    ratio_rule_detectable_drop,
    wilson_check_power,
    wilson_detectable_drop,
    wilson_interval,
    wilson_lower_bound,
    wilson_margin,
)

# (losses b, wins c) -> (two-sided p, one-sided "backend worse" p). Small cases by hand
# (b=1, c=9: 2 * 11/1024; b=10, c=3: 2 * 378/8192); the others from scipy 1.17.1,
# scipy.stats.binomtest(b, b + c, 0.5).pvalue and binomtest(..., alternative="greater").pvalue.
MCNEMAR_KNOWN = {
    (0, 0): (1.0, 1.0),
    (0, 5): (0.0625, 1.0),
    (1, 9): (0.021484375, 0.9990234375),
    (10, 3): (0.09228515625, 0.046142578125),
    (3, 10): (0.09228515625, 0.98876953125),
    (7, 7): (1.0, 0.604736328125),
    (25, 12): (0.04703102743951604, 0.02351551371975802),
    (40, 21): (0.0204147137996349, 0.01020735689981745),
    (130, 100): (0.05561357778139238, 0.02780678889069619),
}


@pytest.mark.parametrize(("losses", "wins"), sorted(MCNEMAR_KNOWN))
def test_mcnemar_matches_known_values(losses, wins):
    two_sided, worse = MCNEMAR_KNOWN[losses, wins]
    result = mcnemar_exact(losses, wins)
    assert result.p_two_sided == pytest.approx(two_sided, rel=1e-12), (losses, wins, result)
    assert result.p_backend_worse == pytest.approx(worse, rel=1e-12), (losses, wins, result)


def test_mcnemar_rejects_negative_counts():
    with pytest.raises(ValueError, match="discordant counts"):
        mcnemar_exact(-1, 3)


# Newcombe (1998), "Two-sided confidence intervals for the single proportion", Stat. Med. 17:857,
# Table II, method 3 (Wilson score, no continuity correction), 95%, to 4 decimals.
NEWCOMBE = [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)]


@pytest.mark.parametrize(("successes", "n", "low", "high"), NEWCOMBE)
def test_wilson_interval_matches_newcombe(successes, n, low, high):
    got = wilson_interval(successes, n)
    assert got == pytest.approx((low, high), abs=5e-5), (successes, n, got)


def test_wilson_lower_bound_is_the_lower_end_of_the_doubled_tail_interval():
    assert wilson_lower_bound(81, 263, alpha=0.025) == pytest.approx(0.2553, abs=5e-5)
    assert wilson_lower_bound(81, 263, alpha=0.05) == wilson_interval(81, 263, confidence=0.90)[0]


def test_wilson_rejects_empty_and_impossible_counts():
    with pytest.raises(ValueError, match="at least one trial"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match="0 <= k <= n"):
        wilson_lower_bound(5, 4)


def test_binomial_matches_scipy():
    # scipy.stats.binom.pmf(3, 10, 0.3), binom.cdf(700, 1319, 0.55) (scipy 1.17.1)
    assert binomial_pmf(3, 10, 0.3) == pytest.approx(0.2668279319999998, rel=1e-12)
    assert binomial_cdf(700, 1319, 0.55) == pytest.approx(0.08377162119578514, rel=1e-9)
    assert binomial_pmf(0, 5, 0.0) == 1.0 and binomial_pmf(5, 5, 1.0) == 1.0


def _power_by_enumeration(n, loss_rate, win_rate, alpha):
    """Independent of the implementation's conditioning on the discordant count: a sum over every
    (losses, wins) of the trinomial probability where the exact test rejects."""
    tie_rate, total = 1 - loss_rate - win_rate, 0.0
    for b in range(n + 1):
        for c in range(n - b + 1):
            if mcnemar_exact(b, c).p_backend_worse <= alpha:
                ways = math.comb(n, b) * math.comb(n - b, c)
                total += ways * loss_rate**b * win_rate**c * tie_rate ** (n - b - c)
    return total


@pytest.mark.parametrize(("loss_rate", "win_rate"), [(0.1, 0.02), (0.2, 0.2), (0.3, 0.05)])
def test_mcnemar_power_matches_enumeration(loss_rate, win_rate):
    got = mcnemar_power(30, loss_rate=loss_rate, win_rate=win_rate)
    assert got == pytest.approx(_power_by_enumeration(30, loss_rate, win_rate, 0.05), abs=1e-12)


def test_mcnemar_power_matches_simulation_at_250_questions():
    # 20000 simulated runs of 250 questions (loss 8%, win 3%): rejected in 73.12% (+-0.31%)
    assert mcnemar_power(250, loss_rate=0.08, win_rate=0.03) == pytest.approx(0.7312, abs=0.01)


@pytest.mark.parametrize("noise", [0.0, 0.02, 0.05])
def test_mcnemar_false_alarm_rate_stays_below_alpha(noise):
    assert mcnemar_power(500, loss_rate=noise, win_rate=noise) <= 0.05


def test_mcnemar_detectable_drop_is_the_smallest_with_80_percent_power():
    drop = mcnemar_detectable_drop(250, baseline=0.75, discordance=0.02)
    assert mcnemar_power(250, loss_rate=0.02 + drop, win_rate=0.02) >= 0.8
    assert mcnemar_power(250, loss_rate=0.02 + drop - 1e-3, win_rate=0.02) < 0.8
    assert 0.03 < drop < 0.07, drop


def test_more_questions_and_less_noise_detect_smaller_drops():
    drops = [mcnemar_detectable_drop(n, baseline=0.75, discordance=0.02) for n in (100, 250, 500)]
    assert drops[0] > drops[1] > drops[2], drops
    assert mcnemar_detectable_drop(250, baseline=0.75, discordance=0.0) < drops[1]


def test_detectable_drop_is_inf_when_no_drop_is_big_enough():
    assert mcnemar_detectable_drop(5, baseline=0.75, discordance=0.02) == math.inf


def test_discordance_must_fit_the_baseline():
    with pytest.raises(ValueError, match="discordance"):
        mcnemar_detectable_drop(250, baseline=0.03, discordance=0.05)


def test_wilson_check_power_matches_enumeration():
    threshold = 0.70
    direct = sum(binomial_pmf(k, 250, 0.72) for k in range(251) if wilson_lower_bound(k, 250) < threshold)
    assert wilson_check_power(250, accuracy=0.72, expected=0.75, margin=0.05) == pytest.approx(direct, abs=1e-12)


@pytest.mark.parametrize("n", [250, 1319])
def test_wilson_margin_is_the_smallest_with_false_alarms_below_alpha(n):
    margin = wilson_margin(n, expected=0.756)
    assert wilson_check_power(n, accuracy=0.756, expected=0.756, margin=margin) <= 0.05
    assert wilson_check_power(n, accuracy=0.756, expected=0.756, margin=margin - 1e-4) > 0.05


def test_wilson_detectable_drop_reaches_the_power():
    margin = wilson_margin(250, expected=0.756)
    drop = wilson_detectable_drop(250, expected=0.756, margin=margin)
    assert wilson_check_power(250, accuracy=0.756 - drop, expected=0.756, margin=margin) >= 0.8
    assert wilson_check_power(250, accuracy=0.756 - drop + 1e-3, expected=0.756, margin=margin) < 0.8


def test_vllm_ratio_rule_lets_a_six_point_drop_through_at_250_questions():
    # measured >= 0.92 * 0.756 fails on <= 173 of 250 right: a 6-point drop fails only 47% of the time
    assert binomial_cdf(173, 250, 0.696) == pytest.approx(0.4690416707102113, rel=1e-9)
    drop = ratio_rule_detectable_drop(250, expected=0.756)
    assert 0.08 < drop < 0.095, drop
    assert drop > mcnemar_detectable_drop(250, baseline=0.756, discordance=0.05)


# --- the library-backed functions agree with the pure-Python ones they replaced ---------------
# (tests/gates/pure_python_stats.py: gates/stats.py as it was, exact sums and the closed-form Wilson)

import json  # noqa: E402

import pa_oracle.gates.stats as stats  # noqa: E402
from pa_oracle import golden  # noqa: E402

from tests.gates import pure_python_stats as pure  # noqa: E402

GRID_N = (0, 1, 2, 7, 50, 250, 1319)
GRID_P = (0.0, 1e-3, 0.05, 0.3, 0.5, 0.72, 0.99, 1.0)


def _close(new: float, old: float, rel: float = 1e-9, abs_: float = 1e-14) -> bool:
    return new == pytest.approx(old, rel=rel, abs=abs_)


def test_binomial_agrees_with_the_pure_python_sums():
    for n in GRID_N:
        for p in GRID_P:
            for k in sorted({0, 1, n // 3, n // 2, n - 1, n} - {-1}):
                if 0 <= k <= n:
                    assert _close(stats.binomial_pmf(k, n, p), pure.binomial_pmf(k, n, p)), (k, n, p)
            for k in (-1, 0, 1, n // 4, n // 2, n - 1, n, n + 1):
                assert _close(stats.binomial_cdf(k, n, p), pure.binomial_cdf(k, n, p)), (k, n, p)
                assert _close(stats.binomial_tail(k, n, p), pure.binomial_tail(k, n, p)), (k, n, p)


def test_mcnemar_agrees_with_the_exact_integer_test_on_a_grid():
    pairs = [(b, c) for b in range(41) for c in range(41)] + [(130, 100), (300, 250), (12, 400), (660, 659)]
    for b, c in pairs:
        new, old = stats.mcnemar_exact(b, c), pure.mcnemar_exact(b, c)
        assert _close(new.p_two_sided, old.p_two_sided) and _close(new.p_backend_worse, old.p_backend_worse), (b, c)
        for alpha in (0.01, 0.05, 0.1):  # the gate's verdict is p <= alpha
            assert (new.p_backend_worse <= alpha) == (old.p_backend_worse <= alpha), (b, c, alpha)


def test_the_critical_loss_count_is_the_exact_ones():
    import numpy as np
    from fractions import Fraction

    for alpha in (0.01, 0.05, 0.1):
        new = stats._critical_losses(np.arange(1501), alpha)
        assert [int(k) for k in new] == [pure._critical_losses(d, Fraction(alpha)) for d in range(1501)], alpha


def test_wilson_agrees_with_the_closed_form_on_every_count():
    for n in GRID_N[1:]:
        for k in range(n + 1):
            for confidence in (0.8, 0.9, 0.95, 0.99):
                assert stats.wilson_interval(k, n, confidence=confidence) == pytest.approx(
                    pure.wilson_interval(k, n, confidence=confidence), abs=1e-12), (k, n, confidence)
            for alpha in (0.01, 0.05):
                assert _close(stats.wilson_lower_bound(k, n, alpha=alpha), pure.wilson_lower_bound(k, n, alpha=alpha),
                              abs_=1e-12), (k, n, alpha)


@pytest.mark.parametrize("n", [20, 250, 1319])
def test_power_margin_and_detectable_drops_agree(n):
    for loss_rate, win_rate in ((0.0, 0.0), (0.02, 0.01), (0.05, 0.05), (0.1, 0.03)):
        assert _close(stats.mcnemar_power(n, loss_rate=loss_rate, win_rate=win_rate),
                      pure.mcnemar_power(n, loss_rate=loss_rate, win_rate=win_rate), rel=1e-8, abs_=1e-12)
    for expected in (0.05, 0.1387, 0.45, 0.9):
        assert stats.wilson_margin(n, expected=expected) == pytest.approx(pure.wilson_margin(n, expected=expected), abs=1e-12)
        # each with its own margin, as the gate uses them: the count at the margin's edge has a bound
        # equal to expected - margin up to rounding, and the two round it differently
        margin, old_margin = stats.wilson_margin(n, expected=expected), pure.wilson_margin(n, expected=expected)
        for accuracy in (expected, expected - 0.03):
            assert _close(stats.wilson_check_power(n, accuracy=accuracy, expected=expected, margin=margin),
                          pure.wilson_check_power(n, accuracy=accuracy, expected=expected, margin=old_margin), rel=1e-8)
        assert stats.wilson_detectable_drop(n, expected=expected, margin=margin) == pytest.approx(
            pure.wilson_detectable_drop(n, expected=expected, margin=old_margin), abs=2e-5)
    assert stats.mcnemar_detectable_drop(n, baseline=0.14, discordance=0.02) == pytest.approx(
        pure.mcnemar_detectable_drop(n, baseline=0.14, discordance=0.02), abs=2e-5)


def test_the_golden_gsm8k_verdicts_do_not_change():
    """For every expected result in golden/gsm8k and every count of right answers, the Wilson
    check passes or fails as it did with the pure-Python statistics."""
    files = sorted(golden.gsm8k_dir().glob("*.json"))
    assert files, golden.gsm8k_dir()
    for path in files:
        data = json.loads(path.read_text())
        n = data["n"]
        for filter_name, target in data["accuracy"].items():
            for alpha in (0.05, 0.01):
                margin, old_margin = stats.wilson_margin(n, expected=target, alpha=alpha), pure.wilson_margin(n, expected=target, alpha=alpha)
                assert margin == pytest.approx(old_margin, abs=1e-12), (path.name, filter_name)
                for right in range(n + 1):
                    fails = stats.wilson_lower_bound(right, n, alpha=alpha) < target - margin
                    failed = pure.wilson_lower_bound(right, n, alpha=alpha) < target - old_margin
                    assert fails == failed, (path.name, filter_name, alpha, right)
