"""Rung 1: node/prewarm.py's own pieces: the libvirt node device a VF is,
the record of what a pre-warm moved read back from an intent (anything else
read as nothing), and libvirt's refusals as one line. The whole pre-warm,
through the peer's commands: tests/unit/kvm_sriov/actions/test_peer.py."""

from types import SimpleNamespace

import libvirt
import pytest

from kvm_sriov.errors import HypervisorError
from kvm_sriov.node import prewarm
from kvm_sriov.vf.intents import Intent


def test_the_node_device_of_a_vf():
    assert prewarm.node_device("0000:03:00.2") == "pci_0000_03_00_2"
    assert prewarm.node_device("0001:af:1f.7") == "pci_0001_af_1f_7"


@pytest.mark.parametrize("action, data, moved", [
    ("migrate-in", {"vfs": ["0000:03:00.1"], "prewarm": ["0000:03:00.1"]}, ["0000:03:00.1"]),
    ("migrate-in", {"vfs": ["0000:03:00.1"]}, []),                       # an older reserve
    ("migrate-in", {"prewarm": "0000:03:00.1"}, []),                     # not a list
    ("migrate-in", {"prewarm": ["0000:03:00.1", 7, None]}, ["0000:03:00.1"]),
    ("deploy", {"prewarm": ["0000:03:00.1"]}, []),                       # only a migration's
])
def test_what_a_prewarm_moved_is_read_from_its_intent_only(action, data, moved):
    assert prewarm.moved_by(Intent(42, action, "reserved", data, 0.0, None)) == moved
    assert prewarm.moved_by(None) == []


class _Refusing:
    """A libvirt connection whose node device refuses both ways."""

    def nodeDeviceLookupByName(self, name):
        def refuse(*args):
            raise libvirt.libvirtError(f"Requested operation is not valid: PCI device {name} is in use")
        return SimpleNamespace(detachFlags=refuse, reAttach=refuse)


@pytest.mark.parametrize("call, said", [(prewarm._bind, "could not bind VF 0000:03:00.2 to vfio-pci"),
                                        (prewarm._give_back, "could not give VF 0000:03:00.2 back")])
def test_a_libvirt_refusal_is_one_line(call, said):
    host = SimpleNamespace(hypervisor=SimpleNamespace(conn=_Refusing()))
    with pytest.raises(HypervisorError) as err:
        call(host, "0000:03:00.2")
    assert said in str(err.value) and "pci_0000_03_00_2 is in use" in str(err.value)
    assert "\n" not in str(err.value)
