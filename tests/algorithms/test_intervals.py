"""The Wilson score interval against values worked by hand (issue 30)."""

import math

import pytest

from roll.algorithms.intervals import wilson_interval


def by_quadratic(k, n, z=1.96):
    """The interval's ends as the roots of (phat - p)^2 = z^2 p (1 - p) / n, a form independent of the code's."""
    phat = k / n
    a, b, c = 1 + z * z / n, -(2 * phat + z * z / n), phat * phat
    d = math.sqrt(b * b - 4 * a * c)
    return (-b - d) / (2 * a), (-b + d) / (2 * a)


@pytest.mark.parametrize("k, n, low, high", [
    (3, 8, 0.1368, 0.6943),    # by hand: centre 0.6151 / 1.4802 = 0.41555, half-width 0.41255 / 1.4802 = 0.27871
    (0, 8, 0.0, 0.3244),       # zero successes still leaves a third of the range open
    (8, 8, 0.6756, 1.0),
    (32, 64, 0.3810, 0.6190),  # half of 64 levels: +-12 points
    (13, 64, 0.1227, 0.3171),
])
def test_wilson_matches_hand_values(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)
    assert (lo, hi) == pytest.approx(by_quadratic(k, n), abs=1e-12)


def test_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(1 - hi)  # symmetric around one half
    with pytest.raises(ValueError):
        wilson_interval(9, 8)
