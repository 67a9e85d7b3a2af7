"""bench/actions_bench.py's verdict: the median of the pairs' ratios and its
distribution-free 95 % interval (sign test), and when rounds are added."""

import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import actions_bench  # noqa: E402


@pytest.mark.parametrize("n, low_rank", [(6, 1), (8, 1), (10, 2), (16, 4), (20, 6)])
def test_the_interval_is_the_sign_tests(n, low_rank):
    """Ranks from P(Binomial(n, 1/2) < k) <= 2.5 %: for 10 pairs the 2nd and
    9th smallest ratios, for 20 the 6th and 15th."""
    ours = [1 + i / 100 for i in range(n)][::-1]  # any order: ratios are sorted
    ratio, (low, high) = actions_bench.median_ratio(ours, [1.0] * n)
    ratios = sorted(ours)
    assert (low, high) == (ratios[low_rank - 1], ratios[n - low_rank])
    assert ratio == pytest.approx((ratios[(n - 1) // 2] + ratios[n // 2]) / 2)


def test_too_few_pairs_have_no_interval():
    assert actions_bench.median_ratio([1.2] * 5, [1.0] * 5) == (pytest.approx(1.2), (None, None))


def test_rounds_are_added_only_while_a_median_is_over_the_target():
    within = {"deploy": {"kvm-sriov": [1.04, 1.0], "kvm": [1.0, 1.0]}}
    over = {"deploy": {"kvm-sriov": [1.2, 1.0], "kvm": [1.0, 1.0]}, **{"save": within["deploy"]}}
    assert not actions_bench.over_target(within)
    assert actions_bench.over_target(over)
