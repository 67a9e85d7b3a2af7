"""templates/: parsed with an OpenNebula template parser; every attribute the
driver and the guest scripts read is checked against the conventions."""
import re
import subprocess

import pytest

from guest_helpers import CTX, ROOT, context_from_fixture
from guest_one_template import Template, TemplateError, parse

T = ROOT / "templates"
NET = T / "network" / "ib-partition.tmpl"
VM = T / "vm" / "ib-hpc-node.tmpl"
VM_MAD = T / "oned" / "oned.conf.vm_mad"
VMM_EXEC = T / "oned" / "vmm_exec_kvm-sriov.conf"
CONVENTIONS = ROOT / "docs" / "conventions.md"


# ------------------------------------------------------------------ the parser itself

def test_parser_syntax():
    t = parse('# c\nA = 1\nb = "x \\"y\\" # not a comment"\nNIC = [ NETWORK = "n", MODEL = virtio ]\n'
              'NIC=[NETWORK="m"]\nS = "two\nlines"\n')
    assert t == [("A", "1"), ("B", 'x "y" # not a comment'), ("NIC", {"NETWORK": "n", "MODEL": "virtio"}),
                 ("NIC", {"NETWORK": "m"}), ("S", "two\nlines")]


@pytest.mark.parametrize("bad", ['A = "open', "A = [ B = 1", "= 1", "A = [ B = [ C = 1 ] ]",
                                 "A 1", "A = [ B = 1, B = 2 ]"])
def test_parser_rejects(bad):
    with pytest.raises(TemplateError):
        parse(bad)


@pytest.mark.parametrize("path", sorted(T.rglob("*.tmpl")) + [VM_MAD, VMM_EXEC], ids=lambda p: p.name)
def test_every_template_parses(path):
    assert Template.load(path).attrs


# ------------------------------------------------------------------ network

def pkey_base(v: str) -> int:
    n = int(v, 16) if v.lower().startswith("0x") else int(v)
    return n & 0x7FFF


def test_network_is_an_ib_sriov_partition():
    net = Template.load(NET)
    # the NIC marker (conventions.md "Which NICs become VFs")
    assert net["VN_MAD"] == "dummy"
    assert net["BRIDGE"] == "ib-sriov" or net["BRIDGE"].startswith("ib-sriov:")
    # VLAN_ID is the PKey
    assert 0 < pkey_base(net["VLAN_ID"]) < 0x7FFF
    assert net.get("PKEY_MEMBERSHIP", "full") in ("full", "limited")
    # IPoIB address range, mask, MTU, mode for the guest scripts
    ar = net["AR"]
    assert ar["TYPE"] == "IP4" and re.fullmatch(r"\d+\.\d+\.\d+\.\d+", ar["IP"]) and int(ar["SIZE"]) > 0
    assert net["NETWORK_MASK"] == "255.255.0.0"
    assert net["IPOIB_MODE"] in ("datagram", "connected")
    limit = 4092 if net["IPOIB_MODE"] == "datagram" else 65520
    assert int(net["GUEST_MTU"]) <= limit


def test_network_matches_what_oned_puts_in_the_real_fixture():
    """The deploy fixture is a VM on this very network: its NIC carries the
    attributes the driver reads, with our template's values."""
    import xml.etree.ElementTree as ET
    from guest_helpers import FIXTURES
    net = Template.load(NET)
    vm = ET.parse(FIXTURES / "action-deploy.xml").getroot().find("./VM/TEMPLATE")
    ib = [n for n in vm.findall("NIC") if n.findtext("BRIDGE") == net["BRIDGE"]]
    assert len(ib) == 1
    nic = ib[0]
    assert nic.findtext("NETWORK") == net["NAME"]
    assert nic.findtext("VN_MAD") == net["VN_MAD"]
    assert nic.findtext("VLAN_ID") == net["VLAN_ID"]
    ctx = context_from_fixture()
    idx = nic.findtext("NIC_ID")
    assert ctx[f"ETH{idx}_VLAN_ID"] == net["VLAN_ID"]
    assert ctx[f"ETH{idx}_MTU"] == net["GUEST_MTU"]
    assert ctx[f"ETH{idx}_MASK"] == net["NETWORK_MASK"]


# ------------------------------------------------------------------ VM

def ib_nic_index(vm, net):
    nics = vm.all("NIC")
    idx = [i for i, n in enumerate(nics) if n.get("NETWORK") == net["NAME"]]
    assert len(idx) == 1, "exactly one IB NIC"
    return idx[0]


def test_vm_template_requests_a_vf_and_the_hpc_profile():
    vm, net = Template.load(VM), Template.load(NET)
    ib_nic_index(vm, net)
    assert re.search(r"KVM_SRIOV_FREE_VFS\s*>\s*0", vm["SCHED_REQUIREMENTS"])
    assert vm["KVM_SRIOV_HPC"] == "YES"
    assert vm["CPU_MODEL"]["MODEL"] == "host-passthrough"
    assert vm["HYPERVISOR"] == "kvm"


def test_vm_context_runs_the_guest_scripts():
    vm, net = Template.load(VM), Template.load(NET)
    ctx = vm["CONTEXT"]
    assert ctx["NETWORK"] == "YES"
    assert '$FILE[IMAGE="kvm-sriov-ib-context.sh"' in ctx["FILES_DS"]
    assert ctx["INIT_SCRIPTS"] == "kvm-sriov-ib-context.sh"
    assert ctx["IB_INSTALL_STACK"] in ("YES", "NO")
    n = ib_nic_index(vm, net)
    # the mode comes from the network's IPOIB_MODE through OpenNebula's $NETWORK[]
    m = re.fullmatch(r'\$NETWORK\[IPOIB_MODE, NETWORK="([^"]+)"\]', ctx[f"ETH{n}_IPOIB_MODE"])
    assert m and m.group(1) == net["NAME"]
    assert ctx["IB_IRQ_PROFILE"] == "$IB_IRQ_PROFILE"


def test_vm_user_input_offers_exactly_the_scripts_profiles():
    vm = Template.load(VM)
    spec = vm["USER_INPUTS"]["IB_IRQ_PROFILE"].split("|")
    assert spec[1] == "list"
    options, default = spec[3].split(","), spec[4]
    assert options == ["default", "low-latency", "throughput"] and default in options
    for p in options:  # the guest library accepts each one
        r = subprocess.run(["bash", "-c", f'. "{CTX}/kvm-sriov-ib.d/functions.sh"; IB_IRQ_PROFILE={p} ib_irq_settings'],
                           capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
        assert r.returncode == 0, p


def test_every_guest_context_variable_of_the_conventions_is_used():
    names = set(re.findall(r"`(IB_[A-Z_]+)`", CONVENTIONS.read_text()))
    assert {"IB_IRQ_PROFILE", "IB_INSTALL_STACK", "IB_SUBNET_MANAGER", "IB_SM_PRIORITY"} <= names
    lib = (CTX / "kvm-sriov-ib.d" / "functions.sh").read_text()
    for name in names:
        assert name in lib, name
    assert "_IPOIB_MODE" in lib


# ------------------------------------------------------------------ oned

def test_oned_vm_mad_snippet():
    mad = Template.load(VM_MAD)["VM_MAD"]
    assert mad["NAME"] == "kvm-sriov"
    assert mad["EXECUTABLE"] == "one_vmm_exec"
    assert "kvm-sriov" in mad["ARGUMENTS"].split()
    assert mad["TYPE"] == "kvm"
    assert mad["DEFAULT"] == "vmm_exec/" + VMM_EXEC.name


def test_vmm_exec_defaults():
    d = Template.load(VMM_EXEC)
    assert d["OS"]["MACHINE"] == "q35"
    assert d["CPU_MODEL"]["MODEL"] == "host-passthrough"


# ------------------------------------------------------------------ cluster

def test_cluster_script_with_a_stand_in_cli(tmp_path):
    """Run create-cluster.sh for real against recording one* commands."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "calls"
    for cmd in ("onevnet", "onetemplate"):
        p = bin_ / cmd
        # "show" fails: nothing exists yet
        p.write_text(f'#!/bin/sh\necho "{cmd} $*" >> "{log}"\n[ "$1" = show ] && exit 1\nexit 0\n')
        p.chmod(0o755)
    r = subprocess.run([str(T / "cluster" / "create-cluster.sh"), "3", "hpc"], capture_output=True, text=True,
                       env={"PATH": f"{bin_}:/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    assert calls == [
        "onevnet show ib-pkey-0x8001",
        f"onevnet create {T}/cluster/../network/ib-partition.tmpl",
        "onetemplate show ib-hpc-node",
        f"onetemplate create {T}/cluster/../vm/ib-hpc-node.tmpl",
        "onetemplate instantiate ib-hpc-node --multiple 3 --name hpc-%i",
    ]
