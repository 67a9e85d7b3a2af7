"""bench/actions_bench.py's verdict: the median of the pairs' ratios and its
distribution-free 95 % interval (sign test), and when rounds are added; and
how it knows a guest is back (it counts again on its serial console)."""

import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import actions_bench  # noqa: E402


@pytest.mark.parametrize("n, low_rank", [(6, 1), (8, 1), (10, 2), (16, 4), (20, 6)])
def test_the_interval_is_the_sign_tests(n, low_rank):
    """Ranks from P(Binomial(n, 1/2) < k) <= 2.5 %, n crossovers (2n rounds):
    for 10 the 2nd and 9th smallest, for 20 the 6th and 15th."""
    crossovers = [1 + i / 100 for i in range(n)][::-1]  # any order: ratios are sorted
    ours = [c for c in crossovers for _ in range(2)]  # both rounds of a crossover alike
    ratio, (low, high) = actions_bench.median_ratio(ours, [1.0] * 2 * n)
    ratios = sorted(crossovers)
    assert (low, high) == pytest.approx((ratios[low_rank - 1], ratios[n - low_rank]))
    assert ratio == pytest.approx((ratios[(n - 1) // 2] + ratios[n // 2]) / 2)


def test_too_few_rounds_have_no_interval():
    assert actions_bench.median_ratio([1.2] * 11, [1.0] * 11) == (pytest.approx(1.2), (None, None))
    assert actions_bench.median_ratio([1.2], [1.0]) == (pytest.approx(1.2), (None, None))


def test_going_first_or_second_cancels_out():
    """kvm-sriov 10 % slower when it goes first, 4 % faster when second: a
    median of the pairs' ratios lands on either (1.10 with one more round
    where it went first); the crossover ratio is their geometric mean."""
    ours = [1.10, 0.96] * 6 + [1.10]
    ratio, (low, high) = actions_bench.median_ratio(ours, [1.0] * 13)
    assert ratio == low == high == pytest.approx((1.10 * 0.96) ** 0.5)


def test_rounds_are_added_only_while_a_median_is_over_the_target():
    within = {"deploy": {"kvm-sriov": [1.04, 1.0], "kvm": [1.0, 1.0]}}
    over = {"deploy": {"kvm-sriov": [1.2, 1.0], "kvm": [1.0, 1.0]}, **{"save": within["deploy"]}}
    assert not actions_bench.over_target(within)
    assert actions_bench.over_target(over)


def test_a_count_after_a_byte_offset_is_seen_in_a_console_log(tmp_path):
    """The console writes \\r\\n: an offset in bytes must be applied to bytes.
    (Read as text, each earlier line shifted it by one character, and the
    wait for the guest grew with the log: rounds of 58, 84, 123, 197 s.)"""
    from simhost.guest_image import COUNTER_PREFIX, counted_since, serial_size
    log = tmp_path / "serial.log"
    assert serial_size(log) == 0 and not counted_since(log, 0)
    log.write_bytes(b"".join(f"{COUNTER_PREFIX}{i}\r\n".encode() for i in range(500)))
    mark = serial_size(log)
    assert not counted_since(log, mark)
    with open(log, "ab") as f:
        f.write(f"{COUNTER_PREFIX}500\r\n".encode())
    assert counted_since(log, mark)
