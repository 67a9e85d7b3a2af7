"""Rung 1: a VF's GUID carries the network that leases its NIC's MAC, so
two networks handing out one MAC (oned's default MAC_GLOBAL_SPACE = "NO")
give two GUIDs; restore and migration keep the GUID a VM was deployed with
(MAC-only for VMs deployed before the rule). Deploys through the actions on
libvirt's test driver and the fake sysfs; partitions listed by the same rule."""

import io
import re

import pytest

from kvm_sriov.domain import domain_xml
from kvm_sriov.ib import guid, partitions
from kvm_sriov.actions import main
from kvm_sriov.node.host import Host
from kvm_sriov.domain.hypervisor import Hypervisor
from tests.conftest import FIXTURES
from tests.support.actions_in_process import UUID, deployment
from tests.support.fake_sysfs import ALL_F, standard_host

MAC = "02:00:0a:64:00:2a"                   # the fixtures' IB NIC
MAC_ONLY = "02:00:0a:00:00:64:00:2a"        # its GUID without a network (older rule)
NET5 = "02:00:0a:00:0c:64:00:2a"            # leased by network 5: (5 + 1) * 2 = 0x000c
NET6 = "02:00:0a:00:0e:64:00:2a"
VM = re.search(r"<VM>.*</VM>", (FIXTURES / "opennebula" / "action-deploy.xml").read_text(), re.S).group(0)


def vm_xml(network="5", parent=None):
    """OpenNebula's <VM> (the fixture's IB NIC is on network 5) with another network."""
    text = VM.replace("<NETWORK_ID><![CDATA[5]]></NETWORK_ID>", f"<NETWORK_ID>{network}</NETWORK_ID>"
                      + (f"<PARENT_NETWORK_ID>{parent}</PARENT_NETWORK_ID>" if parent is not None else ""))
    assert text != VM or network == "5"
    return text


def read(p):
    return p.read_text().strip()


def port_of(host):
    """The port GUID the VF of the host's one VF NIC carries (read back from sysfs)."""
    [rec] = host.guid_records()
    from kvm_sriov.ib.guid import backend_for
    vf = host.inventory.vf(rec.vf)
    port = backend_for(host.sysfs, host.inventory.pf(vf.pf), vf.index).read().port
    assert port == rec.port_guid
    return port


def node_of(host):
    [rec] = host.guid_records()
    return rec.node_guid


@pytest.fixture
def hosts(fake_host, make_config, conn, capsys, monkeypatch, tmp_path):
    """Two hosts (own sysfs, own pool, own datastores) on one libvirt test driver."""
    from tests.support.stock_standin import StockOnTestDriver
    stock = StockOnTestDriver(conn).install(monkeypatch)
    standard_host(tmp_path / "h2")
    roots = {"h1": fake_host["root"], "h2": tmp_path / "h2"}

    def cfg(name):
        return make_config(roots[name], state=f"state-{name}")

    def run(name, action, *argv, stdin="", vm_doc=None):
        if vm_doc is not None:
            folder = tmp_path / name / "datastores" / "0" / argv[2]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "vm.xml").write_text(vm_doc + "\n")
        host = Host(cfg(name), Hypervisor("test:///default"), remotes_dir=tmp_path / "remotes")
        code = main(action, list(argv), stdin=io.StringIO(stdin), host=host)
        out, err = capsys.readouterr()
        return code, out, err

    run.dfile = lambda name, vm: str(tmp_path / name / "datastores" / "0" / str(vm) / "deployment.0")
    run.host = lambda name: Host(cfg(name), Hypervisor("test:///default"))
    run.port = lambda name: port_of(run.host(name))
    run.node = lambda name: node_of(run.host(name))
    run.vf0 = lambda name: read(roots[name] / "sys/devices/pci0000:00/0000:03:00.0/sriov/0/port")
    run.stock = stock
    run.tmp = tmp_path
    return run


def test_the_rule():
    assert guid.from_mac(MAC) == (MAC_ONLY, "02:00:0a:00:01:64:00:2a")
    assert guid.from_mac(MAC, 5) == (NET5, "02:00:0a:00:0d:64:00:2a")
    assert guid.from_mac(MAC, 0)[0] == "02:00:0a:00:02:64:00:2a"       # never the MAC-only 00:00
    assert guid.from_mac(MAC, guid.MAX_SPACE) == ("02:00:0a:ff:fe:64:00:2a", "02:00:0a:ff:ff:64:00:2a")
    assert guid.from_mac(MAC, guid.MAX_SPACE + 1)[0] == MAC_ONLY       # does not fit: MAC-only
    ports = {guid.from_mac(MAC, n)[0] for n in range(guid.MAX_SPACE + 1)}
    nodes = {guid.from_mac(MAC, n)[1] for n in range(guid.MAX_SPACE + 1)}
    assert len(ports | nodes | {MAC_ONLY}) == 2 * (guid.MAX_SPACE + 1) + 1   # all distinct
    assert guid.mac_derived(MAC_ONLY) and not guid.mac_derived(NET5)  # NET5 only with a record


def test_same_mac_on_two_networks_gives_two_guids_on_two_hosts(hosts, conn):
    """The audit's case: two networks with one IPv4 range lease one MAC to
    two VMs on two hosts; both deploys succeed and the ports must differ."""
    code, _, err = hosts("h1", "deploy", hosts.dfile("h1", 42), "h1", "42", "h1",
                         stdin=deployment(), vm_doc=vm_xml("5"))
    assert code == 0, err
    code, _, err = hosts("h2", "deploy", hosts.dfile("h2", 43), "h2", "43", "h2",
                         stdin=deployment(name="one-43", uuid=UUID[:-2] + "43"), vm_doc=vm_xml("6"))
    assert code == 0, err
    assert (hosts.port("h1"), hosts.port("h2")) == (NET5, NET6)
    assert hosts.node("h1") == "02:00:0a:00:0d:64:00:2a"
    # the domain remembers the network its GUID was derived with
    rec = domain_xml.recorded_nics(domain_xml.parse(conn.lookupByName("one-42").XMLDesc(0)))
    assert [(r.mac, r.space) for r in rec] == [(MAC, 5)]
    assert hosts("h1", "cancel", UUID, "h1", "42", "h1")[0] == 0
    assert hosts.vf0("h1") == ALL_F and hosts.host("h1").guid_records() == []


def test_reservation_gets_its_parents_guid(hosts):
    code, _, err = hosts("h1", "deploy", hosts.dfile("h1", 42), "h1", "42", "h1",
                         stdin=deployment(), vm_doc=vm_xml("9", parent=5))
    assert code == 0, err
    assert hosts.port("h1") == NET5


def test_without_vm_xml_mac_only(hosts):
    """No VM document (a deploy run by hand; oned writes vm.xml before each
    deploy): the MAC-only GUID, as before."""
    code, _, err = hosts("h1", "deploy", hosts.dfile("h1", 42), "h1", "42", "h1", stdin=deployment())
    assert code == 0, err
    assert hosts.port("h1") == MAC_ONLY


def test_new_nic_spaces_refuses_what_cannot_be_fabric_unique():
    from kvm_sriov.errors import InputError
    assert guid.new_nic_spaces({MAC: 5}, [MAC]) == {MAC: 5}
    assert guid.new_nic_spaces({MAC: guid.MAX_SPACE}, [MAC]) == {MAC: guid.MAX_SPACE}
    assert guid.new_nic_spaces(None, [MAC]) == {MAC: None}                 # no document: by hand
    with pytest.raises(InputError, match=r"network 32767 is above 32766.*fabric-unique"):
        guid.new_nic_spaces({MAC: guid.MAX_SPACE + 1}, [MAC])
    with pytest.raises(InputError, match="names no virtual network"):
        guid.new_nic_spaces({MAC: None}, [MAC])                           # NIC = [ BRIDGE, MAC ]
    with pytest.raises(InputError, match="names no virtual network"):
        guid.new_nic_spaces({}, [MAC])                                    # not in the document
    # no GUID is written with guid_policy "none": nothing to refuse
    assert guid.new_nic_spaces({MAC: 40000}, [MAC], policy="none") == {MAC: None}


def test_deploy_refuses_a_network_too_large_for_the_guid(hosts):
    """Its VF would get the MAC-only GUID, which another network's partition
    may list: refused before anything is taken."""
    code, _, err = hosts("h2", "deploy", hosts.dfile("h2", 43), "h2", "43", "h2",
                         stdin=deployment(name="one-43", uuid=UUID[:-2] + "43"), vm_doc=vm_xml("40000"))
    assert code != 0 and "network 40000 is above 32766" in err and "fabric-unique" in err
    h2 = hosts.host("h2")
    assert h2.guid_records() == [] and h2.assignments(43) == []
    assert hosts.vf0("h2") != MAC_ONLY


def checkpoint(conn, folder, space):
    """A checkpoint as our save leaves it: VFs off, the NIC in our metadata."""
    root = domain_xml.parse(deployment(nics=0))
    domain_xml.record_nics(root, [domain_xml.NicRecord(MAC, "ib-sriov", space=space)])
    ckpt = folder / "checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    conn.createXML(domain_xml.to_string(root), 0).save(str(ckpt))
    return ckpt


@pytest.mark.parametrize("space, port", [(5, NET5), (None, MAC_ONLY)])
def test_restore_gives_the_guid_the_vm_was_deployed_with(hosts, conn, monkeypatch, space, port):
    """oned's action XML says network 5 either way; a VM deployed before the
    rule (no space in its record) keeps its MAC-only GUID."""
    from kvm_sriov.domain import hotplug
    plugged = []
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds, ports=None: plugged.extend(vfs))
    ckpt = checkpoint(conn, hosts.tmp / "h1" / "datastores" / "0" / "42", space)
    action = (FIXTURES / "opennebula" / "action-restore.xml").read_text()
    action = re.sub(r"<BASE_PATH>.*?</BASE_PATH>", f"<BASE_PATH>{ckpt.parent.parent}</BASE_PATH>", action)  # oned's own
    code, _, err = hosts("h1", "restore", str(ckpt), "h1", UUID, "42", "h1", stdin=action)
    assert code == 0, err
    assert [mac for _, mac in plugged] == [MAC]
    assert hosts.port("h1") == port
    rec = domain_xml.recorded_nics(domain_xml.parse(conn.lookupByUUIDString(UUID).XMLDesc(0)))
    assert [(r.mac, r.space) for r in rec] == [(MAC, space)]   # kept for the next move


def test_migration_destination_uses_the_domains_record(hosts, conn, monkeypatch):
    """kvm-sriov-peer attach on the destination: the domain arrived with its
    record, and the VF there gets the same GUID as on the source."""
    from kvm_sriov.actions import peer
    from kvm_sriov.domain import hotplug
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds, ports=None: None)
    root = domain_xml.parse(deployment(nics=0))
    domain_xml.record_nics(root, [domain_xml.NicRecord(MAC, "ib-sriov", space=5)])
    conn.createXML(domain_xml.to_string(root), 0)
    h2 = hosts.host("h2")
    peer._reserve(h2, 42, "one-42", [{"mac": MAC, "bridge": "ib-sriov"}])
    peer._attach(h2, 42, "one-42")
    assert hosts.port("h2") == NET5


def test_attach_nic_takes_the_network_from_the_action(hosts, conn, monkeypatch):
    from kvm_sriov.domain import hotplug
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds, ports=None: None)
    conn.createXML(deployment(nics=0), 0)
    action = (FIXTURES / "opennebula" / "action-attach_nic.xml").read_text()
    nic = re.search(r"<NIC>(?:(?!</NIC>).)*<ATTACH><!\[CDATA\[YES\]\]></ATTACH>.*?</NIC>", action, re.S).group(0)
    mac = re.search(r"<MAC><!\[CDATA\[(.*?)\]\]>", nic).group(1)
    network = int(re.search(r"<NETWORK_ID><!\[CDATA\[(.*?)\]\]>", nic).group(1))
    code, _, err = hosts("h1", "attach_nic", UUID, mac, "ib-sriov", "-", "dummy", "one-42-2", "42", "h1",
                         stdin=action)
    assert code == 0, err
    assert hosts.port("h1") == guid.port_guid(mac, network) != guid.port_guid(mac)
    rec = domain_xml.recorded_nics(domain_xml.parse(conn.lookupByName("one-42").XMLDesc(0)))
    assert [(r.mac, r.space) for r in rec] == [(mac, network)]


def attach_action(network):
    """The fixture's attach_nic action XML with the attached NIC on ``network``
    (None: a NIC without NETWORK_ID, as NIC = [ BRIDGE, MAC ] gives)."""
    action = (FIXTURES / "opennebula" / "action-attach_nic.xml").read_text()
    old = "<NETWORK_ID><![CDATA[5]]></NETWORK_ID>"
    assert action.count(old) == 1
    return action.replace(old, "" if network is None else f"<NETWORK_ID>{network}</NETWORK_ID>")


@pytest.mark.parametrize("network, why", [("40000", "network 40000 is above 32766"),
                                          (None, "names no virtual network")])
def test_attach_nic_refuses_a_nic_without_a_fabric_unique_guid(hosts, conn, monkeypatch, network, why):
    from kvm_sriov.domain import hotplug
    plugged = []
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds, ports=None: plugged.extend(vfs))
    conn.createXML(deployment(nics=0), 0)
    code, _, err = hosts("h1", "attach_nic", UUID, MAC, "ib-sriov", "-", "dummy", "one-42-2", "42", "h1",
                         stdin=attach_action(network))
    assert code != 0 and why in err and "fabric-unique" in err and "Traceback" not in err
    assert plugged == []
    h1 = hosts.host("h1")
    assert h1.guid_records() == [] and h1.assignments(42) == [] and hosts.vf0("h1") != MAC_ONLY
    assert domain_xml.recorded_nics(domain_xml.parse(conn.lookupByName("one-42").XMLDesc(0))) == []


def test_partitions_list_the_same_rule():
    """Two networks with the same MACs are two partitions now (both kept),
    each listing its own GUIDs; a reservation is folded into its parent."""
    nets = [partitions.Network(5, "a", 0x0001, ranges=(partitions.AddressRange(MAC, 1),)),
            partitions.Network(6, "b", 0x0002, ranges=(partitions.AddressRange(MAC, 1),)),
            partitions.Network(9, "a-resv", 0x0001, ranges=(partitions.AddressRange(MAC, 1),), parent=5)]
    left_out = []
    text = partitions.render(nets, left_out=left_out)
    assert left_out == []
    assert "0x" + NET5.replace(":", "") in text and "0x" + NET6.replace(":", "") in text
    assert partitions.pkey_of(nets, MAC, 6) == 0x0002 and partitions.pkey_of(nets, MAC, 5) == 0x0001
    # a reservation whose parent is not listed (another bridge, say) still lists its VMs' GUIDs
    assert partitions.render(nets[2:]).count("0x" + NET5.replace(":", "")) == 1


@pytest.mark.skipif(not __import__("tests.support.opensm_sim", fromlist=["x"]).available(),
                    reason="needs opensm, ibsim-utils, libumad2sim0, infiniband-diags")
def test_real_opensm_two_networks_one_mac_two_partitions(tmp_path):
    """The real opensm on a simulated fabric: the VM of network 5 and the VM
    of network 6 with one MAC are each in their own PKey only; a MAC-only
    GUID of that MAC (ambiguous) is in neither; one of a MAC only network 5
    leases (a VM deployed before the rule) stays in network 5's PKey."""
    from tests.support import opensm_sim
    nets = [partitions.Network(5, "a", 0x0001, ranges=(partitions.AddressRange(MAC, 1),
                                                       partitions.AddressRange("02:00:0a:64:00:30", 1))),
            partitions.Network(6, "b", 0x0002, "limited", ranges=(partitions.AddressRange(MAC, 1),))]
    old_a = guid.as_int(guid.port_guid("02:00:0a:64:00:30"))
    probe = [guid.as_int(NET5), guid.as_int(NET6), guid.as_int(MAC_ONLY), old_a]
    got = opensm_sim.run(tmp_path / "sim", partitions.render(nets), probe)
    assert "PARSE ERROR" not in got["log"] and "SUBNET UP" in got["log"], got["log"][-2000:]
    assert got["pkeys"][guid.as_int(NET5)] == [0x7FFF, 0x8001]
    assert got["pkeys"][guid.as_int(NET6)] == [0x7FFF, 0x0002]
    assert got["pkeys"][guid.as_int(MAC_ONLY)] == [0x7FFF]
    assert got["pkeys"][old_a] == [0x7FFF, 0x8001]


def test_migration_carries_the_numa_wish(hosts, monkeypatch):
    """The source sends the VM's NUMA wish with the NICs; the destination
    reserves under it (node 1: the mlx4 PF); an entry without one takes any VF."""
    from kvm_sriov.actions import peer
    from kvm_sriov.node.peer import Peer
    h2 = hosts.host("h2")
    entry = {"mac": MAC, "bridge": "ib-sriov", "numa_nodes": [1], "numa_policy": "require"}
    [taken] = peer._reserve(h2, 42, "one-42", [entry])
    assert taken["vf"].startswith("0000:81:00.")
    h2.release_vm(42)
    [taken] = peer._reserve(h2, 42, "one-42", [{"mac": MAC, "bridge": "ib-sriov"}])   # an older source
    assert taken["vf"].startswith("0000:03:00.")
    h2.release_vm(42)
    with pytest.raises(Exception, match="bad NUMA wish"):
        peer._reserve(h2, 42, "one-42", [dict(entry, numa_policy="always")])
    sent = []
    monkeypatch.setattr(Peer, "_run", lambda self, argv, payload=None: sent.append(payload) or [])
    p = Peer.__new__(Peer)
    p.reserve(42, "one-42", [domain_xml.NicRecord(MAC, "ib-sriov")], frozenset({1}), "require")
    assert sent == [[dict(entry, ib_traffic=None)]]   # no IB totals known for the VM
