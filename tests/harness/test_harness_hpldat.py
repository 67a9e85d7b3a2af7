import pytest

from harness_paths import data
from kvm_sriov_bench import hpldat
from kvm_sriov_bench.errors import HarnessError


def test_hpl_dat_matches_the_real_fixture_byte_for_byte():
    assert hpldat.hpl_dat([2000, 4000], 128, 1, 2) == open(data("HPL.dat")).read()


def test_hpcc_inf_matches_the_real_fixture_byte_for_byte():
    assert hpldat.hpcc_inf(2000, 128, 1, 2) == open(data("hpcc_1.5.0_inf.txt")).read()


def test_read_back():
    d = hpldat.read_hpl_dat(hpldat.hpl_dat([1000, 2000], 64, 2, 4))
    assert d == {"Ns": [1000, 2000], "NBs": [64], "Ps": [2], "Qs": [4], "device": 6}
    assert len(hpldat.hpl_dat(1000, 64, 1, 1).splitlines()) == 31


@pytest.mark.parametrize("ranks,grid", [(1, (1, 1)), (2, (1, 2)), (4, (2, 2)), (8, (2, 4)),
                                         (14, (2, 7)), (56, (7, 8)), (7, (1, 7))])
def test_grid(ranks, grid):
    assert hpldat.grid(ranks) == grid


def test_size_from_memory():
    # 48 GiB per node (the paper's Koi servers), 2 nodes, 80 %: sqrt(0.8*96 GiB / 8 B) = 101,527.9 -> 528 blocks of 192
    n = hpldat.size_from_memory(48 * 2 ** 30, nodes=2, nb=192, fraction=0.8)
    assert n == 101376 and n % 192 == 0
    assert 8 * n * n <= 0.8 * 96 * 2 ** 30 < 8 * (n + 192) ** 2
    with pytest.raises(HarnessError):
        hpldat.size_from_memory(1000, nb=192)
