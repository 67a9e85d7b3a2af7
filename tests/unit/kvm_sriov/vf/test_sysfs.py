"""Rung 1: the sysfs reader's PCI address normalisation."""

import pytest

from kvm_sriov.vf.sysfs import normalize_pci_address


@pytest.mark.parametrize("text, norm", [("03:00.1", "0000:03:00.1"), ("0000:0A:1f.7", "0000:0a:1f.7"),
                                        ("ib0", None), ("0000:03:00.8", None)])
def test_normalize(text, norm):
    assert normalize_pci_address(text) == norm
