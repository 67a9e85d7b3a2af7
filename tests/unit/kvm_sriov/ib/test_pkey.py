"""Automatic PKeys from the admin's range, and the hook's CALL_INFO (hostile)."""

import base64
import xml.etree.ElementTree as ET

import pytest

from kvm_sriov import config
from kvm_sriov.errors import ConfigError, InputError
from kvm_sriov.ib import pkey


def vnet(vid, bridge="ib-sriov", vlan=None, auto=False, parent=None, membership=None, error=None):
    t = f"<VNET><ID>{vid}</ID><NAME>n{vid}</NAME><BRIDGE>{bridge}</BRIDGE>"
    if parent is not None:
        t += f"<PARENT_NETWORK_ID>{parent}</PARENT_NETWORK_ID>"
    if vlan is not None:
        t += f"<VLAN_ID>{vlan}</VLAN_ID>"
    t += "<TEMPLATE>"
    if auto:
        t += f"<KVM_SRIOV_PKEY>{auto if isinstance(auto, str) else 'AUTO'}</KVM_SRIOV_PKEY>"
    if membership:
        t += f"<PKEY_MEMBERSHIP>{membership}</PKEY_MEMBERSHIP>"
    if error:
        t += f"<KVM_SRIOV_PKEY_ERROR>{error}</KVM_SRIOV_PKEY_ERROR>"
    return t + "</TEMPLATE></VNET>"


def nets(*vnets):
    return pkey.vnets(ET.fromstring("<VNET_POOL>" + "".join(vnets) + "</VNET_POOL>"), "ib-sriov")


@pytest.mark.parametrize("text, want", [
    ("0x1000-0x1fff", (0x1000, 0x1fff)), ("16 - 20", (16, 20)), ("", None), ("  ", None),
    ("0x7ffe-0x7ffe", (0x7ffe, 0x7ffe))])
def test_range_parsing(text, want):
    assert pkey.parse_range(text) == want


@pytest.mark.parametrize("text", ["0x1000", "0x2000-0x1000", "0-5", "0x7000-0x7fff", "0x8001-0x8002",
                                  "a-b", "0x1000-0x1fff,0x3000-0x3fff", "1-99999999", "0x10000-0x10001"])
def test_a_malformed_range_is_refused(text):
    with pytest.raises(ConfigError):
        pkey.parse_range(text)


def test_the_range_is_read_from_the_config_and_a_bad_one_is_a_config_error():
    assert config.load(files=[], overrides={"infiniband": {"pkey_range": "0x10-0x20"}}).pkey_range == (0x10, 0x20)
    assert config.load(files=[]).pkey_range is None
    with pytest.raises(ConfigError, match="pkey_range"):
        config.load(files=[], overrides={"infiniband": {"pkey_range": "0x20-0x10"}})


def test_lowest_free_key_not_used_by_any_network_on_the_bridge_whatever_its_membership():
    got = pkey.choose(nets(vnet(1, vlan="0x1000"), vnet(2, vlan="0x9001", membership="limited"),
                           vnet(3, auto=True), vnet(4, bridge="br0", vlan="0x1002"),
                           vnet(5, auto=True)), (0x1000, 0x1005))
    # 0x9001 is 0x1001 with the membership bit; a VLAN on another bridge takes no key
    assert got == [pkey.Choice(3, 0x1002), pkey.Choice(5, 0x1003)]


def test_networks_with_a_key_reservations_and_other_bridges_want_none():
    got = pkey.choose(nets(vnet(1, auto=True, vlan="0x1000"), vnet(2, bridge="br0", auto=True),
                           vnet(3, auto=True, parent=1), vnet(4, auto="no"), vnet(5, auto="auto")),
                      (0x1000, 0x1001))
    assert got == [pkey.Choice(5, 0x1001)]


def test_a_reservation_counts_as_its_parent_even_with_a_bridge_of_its_own():
    n = nets(vnet(1, bridge="ib-sriov:mlx5_0", vlan="0x1000"), vnet(2, bridge="x", vlan="0x1001", parent=1))
    assert pkey.used_pkeys(n) == {0x1000, 0x1001}


def test_exhausted_range_says_so_for_each_network_left_without_a_key():
    got = pkey.choose(nets(vnet(1, vlan="0x10"), vnet(2, auto=True), vnet(3, auto=True)), (0x10, 0x11))
    assert got[0] == pkey.Choice(2, 0x11)
    assert got[1].pkey is None and "every PKey" in got[1].error and "0x0010-0x0011" in got[1].error


def test_no_range_refuses_clearly():
    (c,) = pkey.choose(nets(vnet(2, auto=True)), None)
    assert c.pkey is None and "pkey_range is empty" in c.error


@pytest.mark.parametrize("vlan", ["", "garbage", "0x", "-1", "0x7fff", "0", "99999999999999999999",
                                  "0x1000 ; Default", "١٢"])
def test_hostile_vlan_ids_take_no_key_and_break_nothing(vlan):
    got = pkey.choose(nets(vnet(1, vlan=vlan), vnet(2, auto=True)), (0x1000, 0x1000))
    assert got == [pkey.Choice(2, 0x1000)] or (vlan == "" and got[0].network == 1)


def test_a_deleted_networks_key_is_free_again():
    before = nets(vnet(1, vlan="0x1000"), vnet(2, vlan="0x1001"))
    assert pkey.used_pkeys(before) == {0x1000, 0x1001}
    assert pkey.choose(nets(vnet(2, vlan="0x1001"), vnet(3, auto=True)), (0x1000, 0x1001)) == [
        pkey.Choice(3, 0x1000)]


# -- CALL_INFO -------------------------------------------------------------------------
def call_info(result=1, ins=(), outs=None):
    p = "".join(f"<PARAMETER><POSITION>{i}</POSITION><TYPE>IN</TYPE><VALUE>{v}</VALUE></PARAMETER>"
                for i, v in enumerate(("****",) + tuple(ins), 1))
    if outs is not None:
        p += "".join(f"<PARAMETER><POSITION>{i}</POSITION><TYPE>OUT</TYPE><VALUE>{v}</VALUE></PARAMETER>"
                     for i, v in enumerate(outs, 1))
    return f"<CALL_INFO><RESULT>{result}</RESULT><PARAMETERS>{p}</PARAMETERS><EXTRA/></CALL_INFO>"


def stdin(method, text):
    return f"{method} {base64.b64encode(text.encode()).decode()}\n".encode()


def test_allocate_names_the_new_network_from_its_result():
    c = pkey.parse_stdin(stdin("one.vn.allocate", call_info(ins=("NAME=x", "-1"), outs=("true", "12", "0"))))
    assert c == pkey.Call("one.vn.allocate", True, (12,))


def test_a_call_on_an_existing_network_names_it_and_reserve_names_both():
    assert pkey.parse_stdin(stdin("one.vn.delete", call_info(ins=("7",), outs=("true", "7", "0")))).networks == (7,)
    c = pkey.parse_stdin(stdin("one.vn.reserve", call_info(ins=("3", "SIZE=2"), outs=("true", "9", "0"))))
    assert c.networks == (3, 9)
    assert pkey.parse_stdin(stdin("one.vntemplate.instantiate", call_info(
        ins=("4", "n", "false", ""), outs=("true", "21", "0")))).networks == (21,)


def test_a_failed_call_is_seen_as_failed():
    c = pkey.parse_stdin(stdin("one.vn.update", call_info(result=0, ins=("7", "X=1", "1"),
                                                          outs=("false", "[one.vn.update] NO", "1024", "7"))))
    assert not c.success


def test_a_template_smuggling_parameters_does_not_override_onedss_own():
    smuggled = ("</VALUE></PARAMETER><PARAMETER><POSITION>2</POSITION><TYPE>OUT</TYPE>"
                "<VALUE>99</VALUE></PARAMETER><PARAMETER><POSITION>9</POSITION><TYPE>IN</TYPE><VALUE>")
    text = call_info(ins=("5", smuggled), outs=("true", "5", "0"))
    assert pkey.parse_call_info("one.vn.update", text).networks == (5,)
    text = call_info(ins=(smuggled, "-1"), outs=("true", "12", "0"))
    assert pkey.parse_call_info("one.vn.allocate", text).networks == (12,)


@pytest.mark.parametrize("data, why", [
    (b"one.vn.allocate", "2 words|1 word"),
    (b"one.vn.allocate abc def ghi", "word"),
    (b"one.vm.allocate " + base64.b64encode(b"<CALL_INFO/>"), "not a network call"),
    (b"\xff\xfe " + base64.b64encode(b"<CALL_INFO/>"), "not a network call"),
    (b"one.vn.update !!!notbase64!!!", "base64"),
    (b"one.vn.update " + base64.b64encode(b"\xff\xfe\xfd"), "base64 of UTF-8"),
    (b"one.vn.update " + base64.b64encode(b"<CALL_INFO><RESULT>1</RESULT>"), "not well-formed"),
    (b"one.vn.update " + base64.b64encode(b"<VM><ID>1</ID></VM>"), "CALL_INFO expected"),
    (b"one.vn.update " + base64.b64encode(b'<!DOCTYPE x [<!ENTITY a "aaaa">]><CALL_INFO>&a;</CALL_INFO>'),
     "DOCTYPE|entit|DTD"),
    (b"one.vn.update " + b"A" * (pkey.MAX_STDIN_BYTES + 4), "larger than"),
])
def test_bad_hook_arguments_are_refused_with_one_line(data, why):
    with pytest.raises(InputError, match=why) as e:
        pkey.parse_stdin(data)
    assert "\n" not in str(e.value)


def test_calls_on_other_objects_name_no_network():
    # the hook is only registered on network calls; an ID it cannot read names nothing (full resync)
    c = pkey.parse_call_info("one.vn.update", call_info(ins=("x",), outs=("true", "x", "0")))
    assert c.networks == () and c.success


def test_the_ready_state_hook_names_its_network_from_its_xml():
    vnet_xml = "<VNET><ID>14</ID><NAME>x</NAME><BRIDGE>ib-sriov</BRIDGE><STATE>1</STATE></VNET>"
    assert pkey.parse_stdin(stdin(pkey.READY, vnet_xml)) == pkey.Call(pkey.READY, True, (14,))
    with pytest.raises(InputError, match="VNET expected"):
        pkey.parse_stdin(stdin(pkey.READY, call_info()))


# -- quotas: one owner or group cannot take every key ------------------------------------
def owned(vid, uid, gid=1, **kw):
    """vnet() with an owner and a group, as oned writes them."""
    return vnet(vid, **kw).replace("<BRIDGE>", f"<UID>{uid}</UID><GID>{gid}</GID><BRIDGE>", 1)


def test_an_owner_at_its_quota_gets_no_key_and_the_others_still_do():
    n = nets(owned(1, 5, vlan="0x1000"), owned(2, 5, vlan="0x9001"),       # user 5 holds 2 keys of the range
             owned(3, 5, vlan="0x0100"), owned(4, 5, vlan="0x1000"),       # out of range, or the same key: no more
             owned(5, 5, auto=True), owned(6, 6, auto=True), owned(7, 5, auto=True), owned(8, 0, gid=0, auto=True))
    got = pkey.choose(n, (0x1000, 0x10ff), per_user=2, per_group=100)
    assert [(c.network, c.pkey) for c in got] == [(5, None), (6, 0x1002), (7, None), (8, 0x1003)]
    assert got[0].over_quota and "user 5" in got[0].error and "infiniband.pkeys_per_user" in got[0].error
    assert not got[1].over_quota


def test_keys_given_in_one_run_count_and_a_group_has_its_own_quota():
    n = nets(*(owned(vid, uid=vid, gid=7, auto=True) for vid in range(1, 5)), owned(5, 9, gid=8, auto=True))
    got = pkey.choose(n, (0x1000, 0x10ff), per_user=1, per_group=2)
    assert [c.pkey for c in got] == [0x1000, 0x1001, None, None, 0x1002]
    assert got[2].over_quota and "group 7" in got[2].error and "pkeys_per_group" in got[2].error
    got = pkey.choose(nets(owned(1, 4, auto=True), owned(2, 4, auto=True)), (0x1000, 0x10ff), per_user=1)
    assert [c.pkey for c in got] == [0x1000, None]


def test_the_quotas_are_read_from_the_config_with_sane_defaults():
    cfg = config.load(files=[])
    assert (cfg.pkeys_per_user, cfg.pkeys_per_group) == (16, 64)
    cfg = config.load(files=[], overrides={"infiniband": {"pkeys_per_user": 2, "pkeys_per_group": 3}})
    assert (cfg.pkeys_per_user, cfg.pkeys_per_group) == (2, 3)
    for bad in (0, -1, 1.5):
        with pytest.raises(ConfigError, match="pkeys_per_user"):
            config.load(files=[], overrides={"infiniband": {"pkeys_per_user": bad}})


# -- an update that only set what the hook writes -----------------------------------------
def update(template, kind="1", networks=("5",)):
    return pkey.parse_call_info("one.vn.update", call_info(ins=(*networks, template, kind), outs=("true", "5")))


def test_an_update_setting_only_the_hooks_attributes_is_told_apart():
    assert update('VLAN_ID = "0x1000"\nKVM_SRIOV_PKEY_ERROR = ""').hook_attributes == {
        "VLAN_ID": "0x1000", "KVM_SRIOV_PKEY_ERROR": ""}
    assert update('KVM_SRIOV_PKEY_ERROR = "every PKey of \\"x\\" is in use"').hook_attributes == {
        "KVM_SRIOV_PKEY_ERROR": 'every PKey of \\"x\\" is in use'}


@pytest.mark.parametrize("template, kind", [
    ('VLAN_ID = "0x1000"', "0"),                         # a replace drops every other attribute
    ('VLAN_ID = "0x1000"\nPKEY_MEMBERSHIP = "limited"', "1"),
    ('VLAN_ID = "0x1000"\nVLAN_ID = "0x1001"', "1"),
    ("VLAN_ID = 0x1000", "1"), ('# VLAN_ID = "0x1000"', "1"), ("", "1"),
    ('AR = [ SIZE = "2" ]', "1"),
    ("<TEMPLATE><PKEY_MEMBERSHIP>limited</PKEY_MEMBERSHIP></TEMPLATE>", "1"),
    ('VLAN_ID = "0x1000"<PKEY_MEMBERSHIP>limited</PKEY_MEMBERSHIP>', "1"),
    ('VLAN_ID = "0x1000</VALUE></PARAMETER><PARAMETER><POSITION>4</POSITION><TYPE>IN</TYPE><VALUE>1'
     '</VALUE></PARAMETER><PARAMETER><VALUE>"\nPKEY_MEMBERSHIP = "limited"', "0"),
])
def test_any_other_update_is_not_the_hooks_own(template, kind):
    assert update(template, kind).hook_attributes is None
