"""Rung 1: a VM arriving with VFs brings the IB traffic totals oned shows for
it (its MONITORING in vm.xml, the action XML, or from the source host of a
live migration), and they are kept beside its VFs for this host's traffic
probe (kvm_sriov/node/traffic.py: carry), through the real action code
in-process against libvirt's test driver on the fake host."""

from pathlib import Path

import pytest

from kvm_sriov.actions import peer as peer_action
from kvm_sriov.errors import InputError
from kvm_sriov.node import traffic
from kvm_sriov.node.peer import Peer
from tests.support.actions_in_process import UUID, deployment

MONITORING = ("<MONITORING><CPU>3</CPU><IB_RX_BYTES>1000</IB_RX_BYTES><IB_TX_BYTES>2000</IB_TX_BYTES>"
              "<IB_RX_PACKETS>10</IB_RX_PACKETS><IB_TX_PACKETS>20</IB_TX_PACKETS></MONITORING>")


def vm_xml(run, monitoring):
    path = Path(run.dep()).parent / "vm.xml"
    path.parent.mkdir(parents=True, exist_ok=True)
    nic = "<NIC><BRIDGE>ib-sriov</BRIDGE><MAC>02:00:0a:64:00:2a</MAC><NETWORK_ID>5</NETWORK_ID></NIC>"
    path.write_text(f"<VM><ID>42</ID><UID>0</UID>{monitoring}<TEMPLATE>{nic}</TEMPLATE><USER_TEMPLATE/></VM>")


def carried(run):
    return traffic.attached(run.host().config.pool_db)[1]


def test_a_deployed_vm_brings_what_oned_showed_and_it_goes_with_its_vfs(run):
    vm_xml(run, MONITORING)
    code, out, err = run("deploy", run.dep(), "host1", "42", "host1", stdin=deployment(nics=1))
    assert code == 0, err
    assert carried(run) == {42: (1000, 2000, 10, 20)}
    assert run("cancel", UUID, "host1", "42", "host1")[0] == 0
    assert run.pool() == []
    assert carried(run) == {}                        # no VF attached here: the probe reads nothing of it


def test_a_vm_with_no_traffic_in_oned_brings_nothing(run):
    vm_xml(run, "<MONITORING><CPU>3</CPU></MONITORING>")
    code, _out, err = run("deploy", run.dep(), "host1", "42", "host1", stdin=deployment(nics=1))
    assert code == 0, err
    assert carried(run) == {}


def test_the_source_sends_the_totals_to_the_destination_in_each_nic_entry(monkeypatch):
    sent = {}
    monkeypatch.setattr(Peer, "_run", lambda self, args, payload=None: sent.update(args=args, payload=payload))
    Peer.__new__(Peer).reserve(42, "one-42", [type("R", (), {"mac": "02:00:0a:00:00:01", "bridge": "ib-sriov"})()],
                               carried=(1, 2, 3, 4))
    assert sent["payload"][0]["ib_traffic"] == [1, 2, 3, 4]


@pytest.mark.parametrize("value,want", [
    (None, None),                                    # an older source
    ([1, 2, 3, 4], (1, 2, 3, 4)),
])
def test_the_destination_takes_the_totals_the_source_sent(value, want):
    assert peer_action._carried({"ib_traffic": value} if value is not None else {}) == want


@pytest.mark.parametrize("value", [[1, 2, 3], [1, 2, 3, -4], [1, 2, 3, 2 ** 63], [1, 2, 3, True], "1,2,3,4",
                                   [1.5, 2, 3, 4]])
def test_the_destination_refuses_bad_totals_from_the_source(value):
    with pytest.raises(InputError, match="IB traffic totals"):
        peer_action._carried({"ib_traffic": value})
