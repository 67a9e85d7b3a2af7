"""Hostile input gets a clear refusal before any work: host names that
would be ssh options, VM IDs that are not ASCII numbers, stdin that is not
UTF-8 or huge, XML too large or too deep, absurd vCPU counts."""

import io
from xml.etree import ElementTree as ET

import pytest

from kvm_sriov.domain import domain_xml, hpc_profile
from kvm_sriov import opennebula
from kvm_sriov.actions import peer
from kvm_sriov.node.peer import Peer
from kvm_sriov.errors import InputError


@pytest.mark.parametrize("vmid", ["\u00b2", "\u0661\u0662", "1" * 23, "-1", "4294967296", " 7", "7\n"])
def test_a_vmid_must_be_plain_ascii_digits(vmid):
    with pytest.raises(InputError, match="<vmid> must be a non-negative integer"):
        opennebula.parse_argv("cancel", ["one-7", "host1", vmid, "host1"])


def test_a_good_vmid_and_host():
    call = opennebula.parse_argv("migrate", ["one-7", "host2.example.org", "10.0.0.1", "7", "fe80::1"])
    assert (call.vm_id, call.host, call.dest_host) == (7, "fe80::1", "host2.example.org")


@pytest.mark.parametrize("host", ["-oProxyCommand=touch /tmp/x", "host1\n", "a b", "h;id", "", "x" * 300])
@pytest.mark.parametrize("where", ["host", "dest_host"])
def test_a_host_name_that_is_no_host_name_is_refused(host, where):
    args = {"deploy_id": "one-7", "dest_host": "host2", "src_host": "host1", "vmid": "7", "host": "host1"}
    args[where] = host
    with pytest.raises(InputError):
        opennebula.parse_argv("migrate", [args[k] for k in ("deploy_id", "dest_host", "src_host", "vmid", "host")])


def test_the_peer_refuses_bad_hosts_and_arguments_with_a_trailing_newline(tmp_path):
    from kvm_sriov import config
    cfg = config.load(files=[], overrides={"pool": {"state_dir": str(tmp_path)}})
    with pytest.raises(InputError):
        Peer(cfg, "-oProxyCommand=touch /tmp/x")
    assert cfg.peer_command[-2:] == ("--", "{host}")  # ssh reads no host as an option
    p = Peer(cfg, "host2")
    with pytest.raises(InputError, match="refusing to pass"):
        p._run(["release", "7\n"])
    assert peer.main(["release", "\u0661\u0662"]) == 1


def test_stdin_that_is_not_utf8_or_too_large_is_refused():
    bad = io.TextIOWrapper(io.BytesIO(b"<domain>\xff\xfe</domain>"), encoding="utf-8")
    with pytest.raises(InputError, match="not UTF-8"):
        opennebula.read_stdin(bad)
    big = io.StringIO("<a>" + "x" * opennebula.MAX_STDIN_CHARS + "</a>")
    with pytest.raises(InputError, match="larger than"):
        opennebula.read_stdin(big)


@pytest.mark.parametrize("text", ["\ufeff<VM/>", "é<VM/>", "Ω"])
def test_stdin_that_starts_with_a_non_ascii_character_is_returned_as_text(text):
    # not base64: what the XML parser then says about it is the one-line error
    assert opennebula.read_stdin(io.StringIO(text)) == text.strip()


def test_xml_too_deep_or_too_large_is_refused_before_the_work(monkeypatch):
    with pytest.raises(InputError, match="deep"):
        domain_xml.parse("<a>" * 20000 + "</a>" * 20000)
    with monkeypatch.context() as m:   # too large: refused before a parser is made
        m.setattr(domain_xml.ET, "XMLParser", lambda **kw: pytest.fail("the XML was parsed"))
        with pytest.raises(InputError, match="larger than"):
            domain_xml.parse("<domain>" + " " * (domain_xml.MAX_XML_CHARS + 1) + "</domain>")
    with pytest.raises(InputError, match="DOCTYPE"):   # what held: no DTD, no entities
        domain_xml.parse('<!DOCTYPE d [<!ENTITY e "x">]><domain>&e;</domain>')


@pytest.mark.parametrize("vcpu", ["3000000", "four", "\u0662", "0"])
def test_the_hpc_profile_refuses_an_absurd_vcpu_count(vcpu):
    root = ET.fromstring(f"<domain><name>one-7</name><vcpu>{vcpu}</vcpu></domain>")
    with pytest.raises(InputError, match="<vcpu> must be"):
        hpc_profile.apply(root, 0, {0, 1})
    assert root.find("cputune") is None   # refused before a single pin was made


def test_a_pool_this_user_cannot_write_is_named_not_an_internal_error():
    """pool.sqlite3 and its lock made by root (an admin CLI run as root, before
    it switched users): the driver's user gets the path in a clear error."""
    import os
    import shutil
    import tempfile
    from pathlib import Path
    from kvm_sriov.errors import DriverError
    from kvm_sriov.vf.pool import VfPool
    state = Path(tempfile.mkdtemp(prefix="kvm-sriov-state."))
    state.chmod(0o755)
    try:
        pool = VfPool(state / "pool.sqlite3")
        with pool.transaction():
            pass
        pool.close()
        for f in [state, *state.iterdir()]:  # the folder and the database its: only the lock (0640) root's
            if f.name != "pool.sqlite3.lock":
                os.chown(f, 65534, 65534)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.setgid(65534)
                os.setuid(65534)
                try:
                    with VfPool(state / "pool.sqlite3").transaction():
                        pass
                    msg = "no error"
                except DriverError as exc:
                    msg = f"DriverError: {exc}"
                except Exception as exc:
                    msg = f"internal error: {exc!r}"
                os.write(w, msg.encode())
            finally:
                os._exit(0)
        os.close(w)
        msg = os.read(r, 4096).decode()
        os.waitpid(pid, 0)
        assert msg.startswith("DriverError: VF pool lock") and str(state / "pool.sqlite3.lock") in msg, msg
    finally:
        shutil.rmtree(state)


# -- OpenNebula's VM document: IDs as oned has them, a vm.xml that is no file --------
def _vm_document(uid="5", vmgroup="7", network="3"):
    from kvm_sriov.oned.vm_template import VmTemplate
    return VmTemplate.from_text(
        f"<VM><ID>42</ID><UID>{uid}</UID><GID>1</GID><TEMPLATE>"
        f"<VMGROUP><VMGROUP_ID>{vmgroup}</VMGROUP_ID><ROLE>r</ROLE></VMGROUP>"
        f"<NIC><MAC>02:00:0a:00:00:05</MAC><NETWORK_ID>{network}</NETWORK_ID><BRIDGE>ib-sriov</BRIDGE></NIC>"
        f"</TEMPLATE><USER_TEMPLATE><KVM_SRIOV_IVSHMEM><SIZE>64</SIZE></KVM_SRIOV_IVSHMEM></USER_TEMPLATE></VM>")


@pytest.mark.parametrize("field,value", [("uid", "4294967296"), ("uid", "2147483648"), ("uid", "-1"),
                                         ("uid", "9" * 30), ("vmgroup", "4294967297"), ("vmgroup", "1e3")])
def test_ids_above_int32_are_refused_as_oned_never_writes_them(field, value):
    from kvm_sriov.ivshmem import device as ivshmem
    vm = _vm_document(**{field: value})
    with pytest.raises(InputError, match="is not an OpenNebula ID"):
        ivshmem.request_of(vm)
    with pytest.raises(InputError, match="is not an OpenNebula ID"):
        vm.uid if field == "uid" else vm.vmgroup_id
    ok = _vm_document()
    assert (ok.uid, ok.vmgroup_id) == (5, 7) and ivshmem.request_of(ok).name == "kvm-sriov-ivshmem-u5-g7"
    assert _vm_document(uid="2147483647").uid == 2**31 - 1


def test_a_network_id_above_int32_is_refused_in_the_vm_and_the_action_xml():
    from kvm_sriov.oned import action_xml
    with pytest.raises(InputError, match="not an OpenNebula ID"):
        _vm_document(network="4294967301").address_spaces()
    action = ("<VMM_DRIVER_ACTION_DATA>" + ET.tostring(_vm_document(network="4294967301").root,
                                                        encoding="unicode") + "</VMM_DRIVER_ACTION_DATA>")
    with pytest.raises(InputError, match="not an OpenNebula ID"):
        action_xml.guid_spaces(action_xml.parse(action))
    assert _vm_document(network="\u0661").address_spaces() == {"02:00:0a:00:00:05": None}  # no network


def test_a_vm_xml_that_is_a_directory_is_refused_clearly(tmp_path):
    from kvm_sriov.oned import vm_template
    (tmp_path / "vm.xml").mkdir()
    for naming in ((), ("KVM_SRIOV_HPC",)):
        with pytest.raises(InputError, match="not a regular file"):
            vm_template.load(str(tmp_path / "deployment.0"), only_naming=naming)


# -- what a message shows of a tenant's value ----------------------------------------------
def test_a_failure_reason_and_a_log_line_are_bounded():
    selector = "mlx5_" + "x" * 10000
    err = io.StringIO()
    opennebula.fail(f"NIC 02:00:0a:00:00:05 (PF {selector}) asks for a PF; wanted 1 on {selector}", err)
    opennebula.log("WARN", f"PF {selector}", err)
    text = err.getvalue()
    assert len(text) < 600 and text.count("...") == 3 and "mlx5_xxx" in text
    assert max(len(w) for w in text.split()) <= opennebula.MAX_WORD + 2   # '(' and ')'
    err = io.StringIO()
    opennebula.fail("a b " * 5000, err)
    assert len(err.getvalue()) <= opennebula.MAX_MESSAGE + 1
    short = "NIC 02:00:0a:00:00:05 (PF mlx5_0): /var/lib/one//datastores/0/42/deployment.0 missing"
    err = io.StringIO()
    opennebula.fail(short, err)
    assert err.getvalue() == short + "\n"   # what fits stays as it was


def test_a_shown_value_keeps_its_start_and_end():
    value = "/" + "d" * 200 + "/deployment.0"
    s = opennebula.shown(value)
    assert len(s) == opennebula.MAX_SHOWN and s.startswith("/ddd") and s.endswith("deployment.0")
    assert opennebula.shown("mlx5_0") == "mlx5_0"
