"""Rung 1: partitions.conf from OpenNebula networks: golden file, refusals,
and the real opensm accepting it and isolating the networks on a simulated
fabric (ibsim)."""


import pytest

from kvm_sriov.ib import guid, opensm_check, partitions
from kvm_sriov.errors import InputError
from tests.conftest import REPO
from tests.support import opensm_sim

GOLDEN = REPO / "tests" / "ib" / "golden"  # shared with the CLI, probe, Ansible and Puppet tests


def nets():
    return partitions.networks_from_xml((GOLDEN / "vnpool.xml").read_text())


def test_networks_from_opennebula_xml():
    a, b = nets()
    assert (a.id, a.pkey, a.membership) == (3, 0x0001, "full")
    assert (b.id, b.pkey, b.membership) == (4, 0x0002, "limited")
    assert list(a.macs()) == ["02:00:0a:64:00:01", "02:00:0a:64:00:02", "02:00:0a:64:00:03"]
    assert list(b.macs())[2:] == ["02:00:0a:65:01:ff", "02:00:0a:65:02:00"]  # carries across bytes


def test_golden_file():
    text = partitions.render(nets())
    golden = GOLDEN / "partitions.conf"
    if not golden.exists():  # first run writes it; review and commit
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.parametrize("vlan,ok", [("0x8001", 1), ("1", 1), ("32769", 1), ("0x7fff", 0), ("0", 0),
                                     ("0x8000", 0), ("ib", 0), ("0x10000", 0)])
def test_pkey_parsing(vlan, ok):
    if ok:
        assert partitions.parse_pkey(vlan, "n") == 1
    else:
        with pytest.raises(InputError):
            partitions.parse_pkey(vlan, "n")


def test_overlapping_networks_are_both_partitions_and_no_shared_mac_only_guid_is_listed():
    """Two networks that can lease the same MACs (MAC_GLOBAL_SPACE = "NO", same
    IPv4 range): their VMs' GUIDs carry the network ID, so both are
    partitions; the MAC-only GUIDs both could lease (VMs deployed before the
    rule) are in no partition."""
    a = partitions.Network(1, "a", 1, ranges=(partitions.AddressRange("02:00:00:00:00:01", 4),))
    b = partitions.Network(2, "b", 2, ranges=(partitions.AddressRange("02:00:00:00:00:04", 4),))
    c = partitions.Network(3, "c", 3, ranges=(partitions.AddressRange("02:00:00:00:01:00", 1),))
    left = []
    text = partitions.render([a, b, c], left_out=left)
    assert left == []
    assert "0x0200000004000004" in text and "0x0200000006000004" in text   # MAC :04 in network 1 and 2
    assert "0x0200000000000001" in text and "0x0200000000000004" not in text  # MAC-only: shared, nowhere
    assert ("one_vnet_3=0x8003, ipoib, defmember=full :\n    0x0200000008000100,\n"
            "    0x0200000000000100 ;") in text
    assert "0x0200000000000100" not in partitions.render([a, b, c], mac_only=False)


def test_networks_without_room_for_their_id_list_only_unshared_mac_only_guids():
    """Networks whose ID does not fit in the GUID get no new VF NICs; their
    partitions list the MAC-only GUIDs of earlier VMs, except those another
    network can lease too; --no-mac-only-guids leaves them no member."""
    big = guid.MAX_SPACE + 1
    a = partitions.Network(big, "a", 1, ranges=(partitions.AddressRange("02:00:00:00:00:01", 4),))
    b = partitions.Network(big + 1, "b", 2, ranges=(partitions.AddressRange("02:00:00:00:00:04", 4),))
    c = partitions.Network(3, "c", 3, ranges=(partitions.AddressRange("02:00:00:00:01:00", 1),))
    left = []
    text = partitions.render([a, b, c], left_out=left)
    assert left == [] and a.port_guids() == []
    assert f"# network {big} 'a': ID above {guid.MAX_SPACE}, VF NICs refused" in text
    assert "0x0200000000000001" in text and "0x0200000000000004" not in text  # shared: nowhere
    assert "0x0200000000000007" in text                                       # b's own
    text = partitions.render([a, b, c], mac_only=False)
    assert f"one_vnet_{big}=0x8001, ipoib, defmember=full : ;" in text and "0x0200000000000001" not in text


def vnet(vid, mac, size, vlan="<VLAN_ID>0x8010</VLAN_ID>", extra="", bridge="ib-sriov"):
    return (f"<VNET><ID>{vid}</ID><NAME>n{vid}</NAME><BRIDGE>{bridge}</BRIDGE>{vlan}{extra}"
            f"<AR_POOL><AR><AR_ID>0</AR_ID><MAC>{mac}</MAC><SIZE>{size}</SIZE></AR></AR_POOL></VNET>")


A_OLD = "0x0200000000000002"        # MAC-only GUID of 02:00:00:00:00:02: a VM of A from before the rule


@pytest.mark.parametrize("b", [
    vnet(40000, "02:00:00:00:00:01", 4, vlan=""),                                  # no VLAN_ID
    vnet(40000, "02:00:00:00:00:01", 70000, vlan="<VLAN_ID>0x8020</VLAN_ID>"),     # > 65,536 MACs
    vnet(40000, "02:00:00:00:00:01", 4, vlan="<VLAN_ID>0x8020</VLAN_ID>",
         extra="<TEMPLATE><PKEY_MEMBERSHIP>both</PKEY_MEMBERSHIP></TEMPLATE>"),    # its owner's typo
    vnet(40000, "02:00:00:00:00:01", 4, vlan="<VLAN_ID>0x8010</VLAN_ID>",
         extra="<TEMPLATE><PKEY_MEMBERSHIP>limited</PKEY_MEMBERSHIP></TEMPLATE>"),  # A's PKey, other membership
    vnet(6, "02:00:00:00:00:01", 4, vlan=""),                                      # a small ID, left out too
])
def test_a_left_out_network_still_makes_its_mac_only_guids_ambiguous(b):
    """Network A (5) and B lease the same MACs; B is left out of the file. A VM
    of B carrying a MAC-only GUID must not become a member of A's PKey."""
    xml = f"<VNET_POOL>{vnet(5, '02:00:00:00:00:01', 2)}{b}</VNET_POOL>"
    left = []
    text = partitions.render(partitions.networks_from_xml(xml), left_out=left)
    assert [x.network.id for x in left] == [int(b[10:b.index("</ID>")])]
    assert "one_vnet_5=0x8010, ipoib, defmember=full :" in text
    assert "0x020000000c000002" in text          # A's VMs with the network in their GUID
    assert A_OLD not in text                     # B's VMs could carry it too


def test_a_reservations_parent_on_another_bridge_counts():
    """Reservation 12 of network 11 (whose BRIDGE is another) is on ib-sriov;
    network 11's other MACs may have been leased with a MAC-only GUID too."""
    xml = (f"<VNET_POOL>{vnet(5, '02:00:00:00:00:01', 2)}"
           f"{vnet(11, '02:00:00:00:00:00', 8, bridge='br0')}"
           f"{vnet(12, '02:00:00:00:00:06', 2, extra='<PARENT_NETWORK_ID>11</PARENT_NETWORK_ID>')}</VNET_POOL>")
    nets = partitions.networks_from_xml(xml)
    assert [(n.id, n.counted_only) for n in nets] == [(5, False), (12, False), (11, True)]
    left = []
    text = partitions.render(nets, left_out=left)
    assert left == [] and "one_vnet_11" not in text and "one_vnet_5_one_vnet_12=0x8010" in text
    assert A_OLD not in text and "0x0200000000000001" not in text   # network 11 can lease them
    assert "0x0200000000000006" in text                            # the reservation's own space


def test_unknown_macs_make_every_mac_only_guid_ambiguous():
    bad = vnet(7, "not-a-mac", 2)
    left = []
    text = partitions.render(partitions.networks_from_xml(f"<VNET_POOL>{vnet(5, '02:00:00:00:00:01', 2)}{bad}"
                                                          f"</VNET_POOL>"), left_out=left)
    assert [x.network.id for x in left] == [7] and "no partition lists MAC-only GUIDs" in str(left[0])
    assert "0x020000000c000002" in text and A_OLD not in text and "0x0200000000000001" not in text


@pytest.fixture
def expanded(monkeypatch):
    """IDs of the networks over MAX_GUIDS_PER_NETWORK whose MACs were listed one by one."""
    big, listing = [], partitions.Network.mac_ints

    def mac_ints(net):
        if sum(ar.size for ar in net.ranges) > partitions.MAX_GUIDS_PER_NETWORK:
            big.append(net.id)
        return listing(net)
    monkeypatch.setattr(partitions.Network, "mac_ints", mac_ints)
    return big


def test_a_huge_left_out_network_counts_without_being_expanded(expanded):
    xml = (f"<VNET_POOL>{vnet(5, '02:00:00:00:00:01', 2)}{vnet(6, '00:00:00:00:00:00', 1 << 47, vlan='')}"
           f"{vnet(7, 'ff:00:00:00:00:00', 1 << 40)}</VNET_POOL>")
    left = []
    text = partitions.render(partitions.networks_from_xml(xml), left_out=left)
    assert expanded == []
    assert [x.network.id for x in left] == [6, 7] and A_OLD not in text and "0x020000000c000002" in text


def test_shared_macs_counts_address_spaces_not_ranges():
    n = partitions.Network
    r = partitions.AddressRange
    nets = [n(1, "a", 1, ranges=(r("00:00:00:00:00:00", 10), r("00:00:00:00:00:05", 10))),   # one space
            n(2, "a-resv", 1, ranges=(r("00:00:00:00:00:02", 2),), parent=1),
            n(3, "b", 2, ranges=(r("00:00:00:00:00:0e", 4),)),
            n(4, "wraps", 3, ranges=(r("ff:ff:ff:ff:ff:ff", 3),))]
    assert partitions._shared_macs(nets) == [(0, 2), (14, 15)]


def test_a_reservation_is_folded_into_its_parent_whatever_membership_its_owner_set():
    """`onevnet reserve` copies the parent's MACs and PKey, and its owner may set
    PKEY_MEMBERSHIP: neither blocks anybody's partitions."""
    xml = """<VNET_POOL>
      <VNET><ID>3</ID><NAME>ib-a</NAME><BRIDGE>ib-sriov</BRIDGE><VLAN_ID>0x8001</VLAN_ID><PARENT_NETWORK_ID/>
        <AR_POOL><AR><AR_ID>0</AR_ID><MAC>02:00:0a:64:00:01</MAC><SIZE>4</SIZE></AR></AR_POOL></VNET>
      <VNET><ID>9</ID><NAME>mine</NAME><BRIDGE>ib-sriov</BRIDGE><VLAN_ID>0x8001</VLAN_ID>
        <PARENT_NETWORK_ID>3</PARENT_NETWORK_ID><TEMPLATE><PKEY_MEMBERSHIP>limited</PKEY_MEMBERSHIP></TEMPLATE>
        <AR_POOL><AR><AR_ID>0</AR_ID><MAC>02:00:0a:64:00:02</MAC><SIZE>2</SIZE>
          <PARENT_NETWORK_AR_ID>0</PARENT_NETWORK_AR_ID></AR></AR_POOL></VNET>
    </VNET_POOL>"""
    left = []
    text = partitions.render(partitions.networks_from_xml(xml), left_out=left)
    assert left == []
    assert "one_vnet_3=0x8001, ipoib, defmember=full :" in text and "one_vnet_9" not in text
    assert text.count("0x02000a0008640002") == 1 and text.count("0x02000a0000640002") == 1


def test_shared_pkey_merges_and_a_mixed_membership_leaves_out_the_later_network():
    a = partitions.Network(1, "a", 5, ranges=(partitions.AddressRange("02:00:00:00:00:01", 1),))
    b = partitions.Network(2, "b", 5, ranges=(partitions.AddressRange("02:00:00:00:01:01", 1),))
    text = partitions.render([a, b])
    assert "one_vnet_1_one_vnet_2=0x8005, ipoib, defmember=full :" in text
    c = partitions.Network(3, "c", 5, "limited")
    left = []
    text = partitions.render([a, c], left_out=left)
    assert [x.network.id for x in left] == [3] and "asks for limited" in str(left[0])
    assert "one_vnet_1=0x8005, ipoib, defmember=full :" in text


def test_a_network_naming_another_users_pkey_joins_no_partition():
    """VLAN_ID is its owner's to write (onevnet update, a template's extra):
    user 7's network naming user 5's key is left out, not merged into it, so
    none of its VMs' GUIDs is in that partition. The same user's networks
    still share a key, and a reservation (any owner) still folds into its parent."""
    def vnet(vid, uid, mac, parent=""):
        return (f"<VNET><ID>{vid}</ID><UID>{uid}</UID><NAME>n{vid}</NAME><BRIDGE>ib-sriov</BRIDGE>"
                f"<VLAN_ID>0x2000</VLAN_ID><PARENT_NETWORK_ID>{parent}</PARENT_NETWORK_ID><AR_POOL><AR>"
                f"<AR_ID>0</AR_ID><MAC>{mac}</MAC><SIZE>2</SIZE></AR></AR_POOL></VNET>")
    xml = ("<VNET_POOL>" + vnet(3, 5, "02:00:0a:64:00:01") + vnet(4, 5, "02:00:0a:64:01:01")
           + vnet(8, 7, "02:00:0a:64:02:01") + vnet(9, 7, "02:00:0a:64:00:01", parent="3") + "</VNET_POOL>")
    nets = partitions.networks_from_xml(xml)
    left = []
    text = partitions.render(nets, left_out=left)
    assert [x.network.id for x in left] == [8] and "another user" in str(left[0])
    assert "one_vnet_3_one_vnet_4=0xa000, ipoib, defmember=full :" in text
    def listed(vid):
        net = next(n for n in nets if n.id == vid)
        return ["0x" + g.replace(":", "") in text for g in net.port_guids()]
    assert listed(4) == [True, True] and listed(8) == [False, False]


@pytest.mark.parametrize("vnet,why", [
    ("<VNET><ID>9</ID><NAME>x</NAME><BRIDGE>ib-sriov</BRIDGE><AR_POOL/></VNET>", "no VLAN_ID"),
    ("<VNET><ID>9</ID><NAME>x</NAME><BRIDGE>ib-sriov</BRIDGE><VLAN_ID>1</VLAN_ID><TEMPLATE>"
     "<PKEY_MEMBERSHIP>both</PKEY_MEMBERSHIP></TEMPLATE></VNET>", "full or limited"),
    ("<VNET><ID>9</ID><NAME>x</NAME><BRIDGE>ib-sriov</BRIDGE><VLAN_ID>1</VLAN_ID><AR_POOL><AR><AR_ID>0</AR_ID>"
     "<MAC>02:00:00:00:00:01</MAC><SIZE>\u0661\u0662</SIZE></AR></AR_POOL></VNET>", "no usable MAC/SIZE"),
    ("<VNET><ID>9</ID><NAME>x</NAME><BRIDGE>ib-sriov</BRIDGE><VLAN_ID>1</VLAN_ID><AR_POOL><AR><AR_ID>0</AR_ID>"
     "<MAC>02:00:00:00:00:01</MAC><SIZE>3000000</SIZE></AR></AR_POOL></VNET>", "more than 65536"),
])
def test_a_network_that_cannot_be_a_partition_is_left_out_alone(vnet, why, expanded):
    good = "<VNET><ID>3</ID><NAME>ok</NAME><BRIDGE>ib-sriov</BRIDGE><VLAN_ID>0x8007</VLAN_ID></VNET>"
    left = []
    text = partitions.render(partitions.networks_from_xml(f"<VNET_POOL>{good}{vnet}</VNET_POOL>"), left_out=left)
    assert expanded == []                      # a 3 M range is refused before it is expanded
    assert [x.network.id for x in left] == [9] and why in str(left[0])
    assert "one_vnet_3=0x8007, ipoib, defmember=full : ;" in text


def test_write_is_atomic_and_idempotent(tmp_path):
    path = tmp_path / "opensm" / "partitions.conf"
    assert partitions.write(path, "x\n") is True
    assert partitions.write(path, "x\n") is False
    assert path.read_text() == "x\n" and [p.name for p in path.parent.iterdir()] == ["partitions.conf"]


@pytest.mark.skipif(not opensm_sim.available(), reason="needs opensm, ibsim-utils, libumad2sim0, infiniband-diags")
def test_real_opensm_accepts_it_and_isolates_networks(tmp_path):
    a, b = nets()
    a_guids = [guid.as_int(g) for g in a.port_guids()]
    b_guids = [guid.as_int(g) for g in b.port_guids()]
    stranger = guid.as_int(guid.port_guid("02:00:0a:66:00:01"))   # a MAC no network leases
    got = opensm_sim.run(tmp_path / "sim", partitions.render(nets()), a_guids[:2] + b_guids[:2] + [stranger])
    assert "PARSE ERROR" not in got["log"] and "SUBNET UP" in got["log"], got["log"][-2000:]
    assert got["sm_pkeys"] == [0xFFFF]                              # the SM: full Default
    for g in a_guids[:2]:
        assert got["pkeys"][g] == [0x7FFF, 0x8001]                   # full in A, never in B
    for g in b_guids[:2]:
        assert got["pkeys"][g] == [0x7FFF, 0x0002]                   # limited in B
    assert got["pkeys"][stranger] == [0x7FFF]                        # only limited Default


@pytest.mark.skipif(not opensm_sim.available(), reason="needs opensm, ibsim-utils, libumad2sim0, infiniband-diags")
def test_real_opensm_reports_a_broken_file(tmp_path):
    got = opensm_sim.run(tmp_path / "sim", "net=0x8001, ipoib : nonsense ;\n", [0x02000a0000640001])
    assert "PARSE ERROR" in got["log"]


def test_every_line_fits_opensm_however_many_ranges_and_names():
    """opensm reads lines into 4 KiB: 200 ranges once made a 4222-byte comment."""
    many = partitions.Network(1, "n" * 5000, 1, ranges=tuple(
        partitions.AddressRange(f"02:00:0a:{r >> 8:02x}:{r & 0xff:02x}:00", 2) for r in range(200)))
    sharing = [partitions.Network(i, f"s{i}", 2, ranges=(partitions.AddressRange(f"02:01:00:00:{i:02x}:00", 1),))
               for i in range(2, 90)]
    text = partitions.render([many, *sharing])
    assert max(len(line.encode()) for line in text.split("\n")) < partitions.MAX_LINE_BYTES
    assert "#   02:00:0a:00:c7:00+2" in text and "one_pkey_0x0002=0x8002" in text


def test_a_line_opensm_cannot_read_is_refused():
    with pytest.raises(InputError, match="partitions.conf line would be"):
        partitions.render([], default_members=["ALL=full"] * 400)


@pytest.mark.skipif(not opensm_check.available(), reason="needs opensm, ibsim-utils, libumad2sim0")
def test_real_opensm_accepts_a_network_with_200_ranges():
    many = partitions.Network(1, "many", 1, ranges=tuple(
        partitions.AddressRange(f"02:00:0a:{r >> 8:02x}:{r & 0xff:02x}:00", 1) for r in range(200)))
    verdict = opensm_check.check_text(partitions.render([many]))
    assert verdict.accepted, verdict.errors


@pytest.mark.skipif(not opensm_check.available(), reason="needs opensm, ibsim-utils, libumad2sim0")
def test_opensm_check_rejects_an_overlong_line():
    verdict = opensm_check.check_text("# " + "x" * 4200 + "\nDefault=0x7fff, ipoib : ALL=full ;\n")
    assert not verdict.accepted and any("PARSE ERROR" in e for e in verdict.errors)


@pytest.mark.parametrize("doc", [
    '<!DOCTYPE d [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;&a;">]><VNET_POOL><VNET><NAME>&b;</NAME></VNET></VNET_POOL>',
    '<!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]><VNET_POOL><VNET><NAME>&x;</NAME></VNET></VNET_POOL>',
    "<VNET_POOL><VNET>",
])
def test_hostile_or_broken_network_xml_is_refused(doc):
    with pytest.raises(InputError):
        partitions.networks_from_xml(doc)


def test_names_with_newlines_and_semicolons_stay_in_their_comment():
    evil = "x\n;\nevil=0x8005, ipoib : ALL=full ;\n#"
    net = partitions.Network(1, evil, 1, ranges=(partitions.AddressRange("02:00:00:00:00:01", 1),))
    bad = partitions.Network(2, evil, 0, problem=f"network 2 ({evil}): no VLAN_ID")
    text = partitions.render([net, bad])
    assert not any(line.startswith("evil") for line in text.splitlines())
    assert [line for line in text.splitlines() if "=0x" in line and not line.startswith("#")] == [
        "Default=0x7fff, ipoib : SELF=full, ALL_SWITCHES=full ;", "one_vnet_1=0x8001, ipoib, defmember=full :"]
    if opensm_check.available():
        assert opensm_check.check_text(text).accepted


@pytest.mark.skipif(not opensm_sim.available(), reason="needs opensm, ibsim-utils, libumad2sim0, infiniband-diags")
def test_real_opensm_a_left_out_networks_vm_is_in_no_other_pkey(tmp_path):
    """Networks A (5, PKey 0x10) and B (40000, no VLAN_ID: left out) lease the
    same MACs. B's VM carries the MAC-only GUID of such a MAC: the real opensm
    gives it only the Default limited; A's VMs keep A's PKey, a pre-rule VM of
    A on a MAC only A leases too."""
    xml = (f"<VNET_POOL>{vnet(5, '02:00:00:00:00:01', 3)}{vnet(40000, '02:00:00:00:00:01', 2, vlan='')}"
           f"</VNET_POOL>")
    text = partitions.render(partitions.networks_from_xml(xml))
    b_vm = guid.as_int(guid.port_guid("02:00:00:00:00:02"))           # == A_OLD
    a_vm = guid.as_int(guid.port_guid("02:00:00:00:00:02", 5))
    a_old = guid.as_int(guid.port_guid("02:00:00:00:00:03"))          # only A leases it
    got = opensm_sim.run(tmp_path / "sim", text, [b_vm, a_vm, a_old])
    assert "PARSE ERROR" not in got["log"] and "SUBNET UP" in got["log"], got["log"][-2000:]
    assert got["pkeys"][b_vm] == [0x7FFF]
    assert got["pkeys"][a_vm] == [0x7FFF, 0x8010]
    assert got["pkeys"][a_old] == [0x7FFF, 0x8010]


# -- networks of whole PFs (BRIDGE = "ib-pf"): their PFs' own port GUIDs ------------------------
PF_A, PF_B = "0xe41d2d0300030002", "0xe41d2d0300040002"   # as the probe reports them (PORT_GUID)


def pf_vnet(vid, guids, uid=0, vlan="0x8030", bridge="ib-pf", name=None):
    return (f"<VNET><ID>{vid}</ID><UID>{uid}</UID><NAME>{name or f'fat{vid}'}</NAME><BRIDGE>{bridge}</BRIDGE>"
            f"<VLAN_ID>{vlan}</VLAN_ID><TEMPLATE><KVM_SRIOV_PF_GUIDS>{guids}</KVM_SRIOV_PF_GUIDS></TEMPLATE>"
            f"<AR_POOL><AR><AR_ID>0</AR_ID><MAC>02:00:0b:00:00:01</MAC><SIZE>8</SIZE></AR></AR_POOL></VNET>")


def test_a_network_of_whole_pfs_lists_its_pfs_port_guids_and_no_mac_guid():
    xml = f"<VNET_POOL>{pf_vnet(7, f'{PF_A}, {PF_B.upper()}', bridge='ib-pf:mlx5_0')}</VNET_POOL>"
    [net] = partitions.networks_from_xml(xml)
    assert net.port_guids() == ["e4:1d:2d:03:00:03:00:02", "e4:1d:2d:03:00:04:00:02"]
    assert net.mac_only_guids() == [] and net.ranges == ()
    text = partitions.render([net])
    assert "# network 7 'fat7': whole PFs, their own port GUIDs (KVM_SRIOV_PF_GUIDS)" in text
    assert "one_vnet_7=0x8030, ipoib, defmember=full :\n    0xe41d2d0300030002,\n    0xe41d2d0300040002 ;" in text


@pytest.mark.parametrize("vnet,why", [
    (pf_vnet(7, PF_A, uid=5), "must be owned by oneadmin"),            # a tenant's: it could name any port
    (pf_vnet(7, "0xe41d2d03000300zz"), "'0xe41d2d03000300zz' is not a port GUID"),
    (pf_vnet(7, "0xffffffffffffffff"), "is not a port GUID"),
    (pf_vnet(7, " ".join(f"0x{n:016x}" for n in range(1, 4099))), "more than 4096 GUIDs"),
    (pf_vnet(7, PF_A, vlan=""), "no VLAN_ID"),
])
def test_a_network_of_whole_pfs_that_cannot_be_trusted_or_read_is_left_out_alone(vnet, why):
    left = []
    text = partitions.render(partitions.networks_from_xml(f"<VNET_POOL>{vnet}{pf_vnet(8, PF_B, vlan='0x8031')}"
                                                          f"</VNET_POOL>"), left_out=left)
    assert [x.network.id for x in left] == [7] and why in str(left[0])
    assert "0xe41d2d0300040002" in text and "0xe41d2d0300030002" not in text


def test_a_pf_two_networks_name_is_in_neither():
    left = []
    text = partitions.render(partitions.networks_from_xml(
        f"<VNET_POOL>{pf_vnet(7, PF_A)}{pf_vnet(8, f'{PF_A} {PF_B}', vlan='0x8031')}</VNET_POOL>"), left_out=left)
    assert [x.network.id for x in left] == [8] and "names 1 port GUID(s) network 7 ('fat7') lists too" in str(left[0])
    assert PF_A not in text and "one_vnet_7=0x8030, ipoib, defmember=full : ;" in text


def test_the_pkeys_of_whole_pf_networks_are_taken_for_automatic_keys():
    from xml.etree import ElementTree as ET
    from kvm_sriov.ib import pkey
    nets = pkey.vnets(ET.fromstring(f"<VNET_POOL>{pf_vnet(7, PF_A, vlan='0x1000')}</VNET_POOL>"), "ib-sriov")
    assert pkey.used_pkeys(nets) == {0x1000}


@pytest.mark.skipif(not opensm_sim.available(), reason="needs opensm, ibsim-utils, libumad2sim0, infiniband-diags")
def test_real_opensm_gives_a_whole_pf_its_networks_pkey_only(tmp_path):
    nets = partitions.networks_from_xml(f"<VNET_POOL>{pf_vnet(7, PF_A)}</VNET_POOL>") + list(globals()["nets"]())
    pf, other = guid.as_int(guid.normalize(PF_A)), guid.as_int(guid.normalize(PF_B))
    got = opensm_sim.run(tmp_path / "sim", partitions.render(nets), [pf, other])
    assert "PARSE ERROR" not in got["log"] and "SUBNET UP" in got["log"], got["log"][-2000:]
    assert got["pkeys"][pf] == [0x7FFF, 0x8030]                       # its network's, full
    assert got["pkeys"][other] == [0x7FFF]                             # a PF no network names
