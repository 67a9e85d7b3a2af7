"""Rung 1: deploy / shutdown / cancel with GUIDs, NUMA and the HPC profile,
in-process against libvirt's test driver (test:///default) on the fake sysfs."""

import io

import pytest
from lxml import etree

from kvm_sriov.actions import main
from kvm_sriov.node.host import Host
from kvm_sriov.domain.hypervisor import Hypervisor
from tests.support.actions_in_process import UUID, deployment
from tests.support.fake_sysfs import ALL_F

PORT = "02:00:0a:00:00:64:00:2a"   # from MAC 02:00:0a:64:00:2a (the fixture's IB NIC)
OPTIONS = "<sriov:options xmlns:sriov='urn:kvm-sriov:metadata:1' {}/>"


_DATASTORES = []  # the current test's datastores folder (a deploy names a file in the VM's folder)


def dfile(vm_id) -> str:
    """Where OpenNebula puts a VM's deployment file: <datastores>/<ds id>/<vm id>/deployment.<n>."""
    return str(_DATASTORES[-1] / "0" / str(vm_id) / "deployment.0")


@pytest.fixture
def run(fake_host, make_config, conn, capsys, monkeypatch, tmp_path):
    from tests.support.stock_standin import StockOnTestDriver
    StockOnTestDriver(conn).install(monkeypatch)  # OpenNebula's kvm scripts, as they act on libvirt
    _DATASTORES.append(tmp_path / "datastores")

    def run(action, *argv, stdin="", **sections):
        cfg = make_config(fake_host["root"], **sections)
        host = Host(cfg, Hypervisor("test:///default"), remotes_dir=tmp_path / "remotes")
        code = main(action, list(argv), stdin=io.StringIO(stdin), host=host)
        out, err = capsys.readouterr()
        return code, out, err

    run.sriov = lambda vf: fake_host["fs"].dev("0000:03:00.0") / "sriov" / str(vf)
    run.cfg = lambda **s: make_config(fake_host["root"], **s)
    return run


def with_options(xml, attrs, pin=None):
    root = etree.fromstring(xml.encode())
    root.append(etree.fromstring(OPTIONS.format(attrs)))
    if pin is not None:
        tune = root.find("cputune")
        for i in range(4):
            etree.SubElement(tune, "vcpupin", vcpu=str(i), cpuset=pin)
    return etree.tostring(root, encoding="unicode")


def read(p):
    return p.read_text().strip()


def test_deploy_programs_guid_and_cancel_restores(run, conn):
    code, out, err = run("deploy", dfile(42), "h", "42", "h", stdin=deployment())
    assert code == 0, err
    assert (read(run.sriov(0) / "port"), read(run.sriov(0) / "policy")) == (PORT, "Follow")
    assert f"port GUID {PORT}" in err
    assert [r.port_guid for r in Host(run.cfg()).guid_records()] == [PORT]
    code, _, err = run("cancel", UUID, "h", "42", "h")
    assert code == 0, err
    assert (read(run.sriov(0) / "port"), read(run.sriov(0) / "policy")) == (ALL_F, "Down")
    assert Host(run.cfg()).guid_records() == []


def test_shutdown_restores(run, conn):
    assert run("deploy", dfile(42), "h", "42", "h", stdin=deployment())[0] == 0
    code, _, err = run("shutdown", UUID, "h", "42", "h")
    assert code == 0, err
    assert read(run.sriov(0) / "port") == ALL_F


def test_failed_start_restores_guids(run, conn):
    bad = deployment().replace("<memory>8388608</memory>", "<memory>-1</memory>")
    code, _, err = run("deploy", dfile(42), "h", "42", "h", stdin=bad)
    assert code == 255 and "Could not create domain" in err   # OpenNebula's deploy failed
    assert read(run.sriov(0) / "port") == ALL_F
    assert Host(run.cfg()).guid_records() == []


def test_guid_collision_refuses_the_deploy(run, conn):
    (run.sriov(3) / "port").write_text(PORT)        # someone set it on VF 3 by hand
    code, out, err = run("deploy", dfile(42), "h", "42", "h", stdin=deployment())
    assert code == 1 and "refusing a GUID collision" in err and out == ""
    assert "one-42" not in [d.name() for d in conn.listAllDomains()]
    assert Host(run.cfg()).assignments() == []
    assert read(run.sriov(0) / "port") == ALL_F


def test_guid_policy_none_leaves_guids_alone(run, conn):
    code, _, err = run("deploy", dfile(42), "h", "42", "h", stdin=deployment(),
                       infiniband={"guid_policy": "none"})
    assert code == 0, err
    assert read(run.sriov(0) / "port") == ALL_F


def test_save_restore_and_migrate_keep_the_guid(run, conn, fake_host, make_config, tmp_path):
    """The API save/restore/migrate use: restore_guids when the VF leaves the
    VM, program_guids again when it comes back (here or on another host):
    the GUID is the same because it derives from the NIC's MAC."""
    assert run("deploy", dfile(42), "h", "42", "h", stdin=deployment())[0] == 0
    host = Host(run.cfg(), Hypervisor("test:///default"))
    allocs = [a for a in []]
    from kvm_sriov.node.host import Allocation
    from kvm_sriov.vf.policy import VfRequest
    a = host.assignments(42)[0]
    allocs = [Allocation(VfRequest(a.mac), host.inventory.vf(a.vf))]
    host.restore_guids(42)                      # save: VF detached, GUID given back
    assert read(run.sriov(0) / "port") == ALL_F
    host.program_guids(42, allocs)              # restore: same VF or another, same GUID
    assert read(run.sriov(0) / "port") == PORT
    # migrate: the destination host (its own sysfs and pool) programs the same GUID
    from tests.support.fake_sysfs import standard_host
    dest_root = tmp_path / "dest"
    standard_host(dest_root)
    dest = Host(make_config(dest_root, state="dest-state"), Hypervisor("test:///default"))
    dest_allocs = [Allocation(VfRequest(a.mac), dest.inventory.vf("0000:03:00.2"))]
    host.restore_guids(42)
    dest.program_guids(42, dest_allocs)
    assert read(dest_root / "sys/devices/pci0000:00/0000:03:00.0/sriov/1/port") == PORT
    assert read(run.sriov(0) / "port") == ALL_F
    dest.restore_guids(42)
    assert read(dest_root / "sys/devices/pci0000:00/0000:03:00.0/sriov/1/port") == ALL_F


# -- NUMA -------------------------------------------------------------------------
def vf_of(conn, name="one-42"):
    xml = etree.fromstring(conn.lookupByName(name).XMLDesc(0).encode())
    addr = xml.find("devices/hostdev/source/address")
    return f"{int(addr.get('bus'), 16):02x}:{int(addr.get('slot'), 16):02x}.{int(addr.get('function'), 16)}"


@pytest.mark.parametrize("policy,pin,ok,vf,warn", [
    ("prefer", "5", True, "81:00.1", False),     # VM on node 1 -> mlx4 PF on node 1
    ("prefer", "1", True, "03:00.1", False),     # VM on node 0 -> mlx5 PF on node 0
    ("require", "5", True, "81:00.1", False),
    ("ignore", "5", True, "03:00.1", False),     # default order: most free VFs (mlx5 first)
    ("prefer", None, True, "03:00.1", False),    # unpinned: no wish
])
def test_numa_policy_matrix(run, conn, policy, pin, ok, vf, warn):
    code, _, err = run("deploy", dfile(42), "h", "42", "h", stdin=with_options(deployment(), "", pin),
                       pool={"numa_policy": policy})
    assert (code == 0) == ok, err
    assert vf_of(conn) == vf
    assert ("not met" in err) == warn


def test_numa_require_refuses_and_prefer_reports(run, conn):
    # Take every free VF on node 1 (mlx4: 81:00.1-.3 eligible; .4 shares its IOMMU group)
    assert run("deploy", dfile(7), "h", "7", "h", stdin=deployment(nics=3, name="one-7",
               uuid="00000000-0000-0000-0000-000000000007").replace(
               "<vcpu>", "<vcpu cpuset='4-7'>").replace("02:00:0a:64:00:2a", "02:00:0a:64:00:07"),
               pool={"numa_policy": "require"})[0] == 0
    code, _, err = run("deploy", dfile(42), "h", "42", "h",
                       stdin=with_options(deployment(), "numa='require'", pin="4"))
    assert code == 1 and "NUMA policy 'require': no free VF" in err and "free elsewhere" in err
    code, _, err = run("deploy", dfile(42), "h", "42", "h",
                       stdin=with_options(deployment(), "numa='prefer'", pin="4"))
    assert code == 0, err
    assert "WARN: NUMA policy 'prefer' not met: VF 0000:03:00.1" in err


# -- HPC profile ---------------------------------------------------------------
def test_hpc_profile_per_vm(run, conn):
    code, _, err = run("deploy", dfile(42), "h", "42", "h", stdin=with_options(deployment(), "hpc='yes'"))
    assert code == 0, err
    xml = etree.fromstring(conn.lookupByName("one-42").XMLDesc(0).encode())
    assert xml.find("cpu").get("mode") == "host-passthrough"
    # the VF went to the node with the most free VFs (node 0: 03:00.1,.2,.4) and the VM with it
    assert vf_of(conn) == "03:00.1"
    assert [p.get("cpuset") for p in xml.findall("cputune/vcpupin")] == ["0", "1", "2", "3"]
    assert xml.find("numatune/memory").attrib == {"mode": "strict", "nodeset": "0"}
    assert xml.find("memoryBacking/hugepages") is not None
    assert xml.find("devices/memballoon").get("model") == "none"
    assert "options" not in etree.tostring(xml).decode()   # the options element was taken out
    assert "INFO: HPC profile: host-passthrough CPU" in err


def test_hpc_profile_per_host_and_vm_opt_out(run, conn):
    code, _, err = run("deploy", dfile(42), "h", "42", "h", stdin=with_options(deployment(), "hpc='no'"),
                       hpc={"profile": True})
    assert code == 0, err
    xml = etree.fromstring(conn.lookupByName("one-42").XMLDesc(0).encode())
    assert xml.find("cputune/vcpupin") is None


def test_bad_options_are_refused(run):
    code, _, err = run("deploy", dfile(42), "h", "42", "h", stdin=with_options(deployment(), "numa='always'"))
    assert code == 1 and "numa='always'" in err


# -- per-VM options as template attributes (vm.xml next to the deployment file) --------
def with_vm_xml(vm_id, user_template):
    """oned's vm.xml for the VM, its USER_TEMPLATE carrying ``user_template``."""
    import re
    from pathlib import Path
    from tests.conftest import FIXTURES
    vm = re.search(r"<VM>.*</VM>", (FIXTURES / "opennebula" / "action-deploy.xml").read_text(), re.S).group(0)
    folder = Path(dfile(vm_id)).parent
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vm.xml").write_text(vm.replace("<USER_TEMPLATE>", "<USER_TEMPLATE>" + user_template, 1) + "\n")


def test_hpc_and_numa_from_template_attributes(run, conn):
    """KVM_SRIOV_HPC / KVM_SRIOV_NUMA, plain attributes any user may set: no RAW needed."""
    with_vm_xml(42, "<KVM_SRIOV_HPC><![CDATA[YES]]></KVM_SRIOV_HPC><KVM_SRIOV_NUMA>prefer</KVM_SRIOV_NUMA>")
    code, _, err = run("deploy", dfile(42), "h", "42", "h", stdin=deployment())
    assert code == 0, err
    xml = etree.fromstring(conn.lookupByName("one-42").XMLDesc(0).encode())
    assert xml.find("cpu").get("mode") == "host-passthrough"
    assert xml.find("numatune/memory").attrib == {"mode": "strict", "nodeset": "0"}
    assert "INFO: HPC profile: host-passthrough CPU" in err


def test_numa_require_from_the_attribute_refuses(run, conn):
    """Node 1's VFs taken; the attribute's 'require' on a VM pinned to node 1 refuses."""
    assert run("deploy", dfile(7), "h", "7", "h", stdin=deployment(nics=3, name="one-7",
               uuid="00000000-0000-0000-0000-000000000007").replace(
               "<vcpu>", "<vcpu cpuset='4-7'>").replace("02:00:0a:64:00:2a", "02:00:0a:64:00:07"),
               pool={"numa_policy": "require"})[0] == 0
    with_vm_xml(42, "<KVM_SRIOV_NUMA>require</KVM_SRIOV_NUMA>")
    code, _, err = run("deploy", dfile(42), "h", "42", "h", stdin=with_options(deployment(), "", pin="4"))
    assert code == 1 and "NUMA policy 'require': no free VF" in err


def test_the_attribute_wins_over_raw_per_option(run, conn):
    with_vm_xml(42, "<KVM_SRIOV_HPC>no</KVM_SRIOV_HPC>")
    code, _, err = run("deploy", dfile(42), "h", "42", "h",
                       stdin=with_options(deployment(), "hpc='yes' numa='prefer'"))
    assert code == 0, err
    xml = etree.fromstring(conn.lookupByName("one-42").XMLDesc(0).encode())
    assert xml.find("cputune/vcpupin") is None and "HPC profile" not in err
    assert "options" not in etree.tostring(xml).decode()   # RAW's element still taken out


@pytest.mark.parametrize("attrs, message", [
    ("<KVM_SRIOV_NUMA>always</KVM_SRIOV_NUMA>", 'KVM_SRIOV_NUMA = "always": use one of prefer, require, ignore'),
    ("<KVM_SRIOV_HPC>maybe</KVM_SRIOV_HPC>", 'KVM_SRIOV_HPC = "maybe": use yes or no'),
    ("<KVM_SRIOV_HPC><X>1</X></KVM_SRIOV_HPC>", "KVM_SRIOV_HPC must be a single value"),
])
def test_bad_attribute_refuses_and_changes_nothing(run, conn, attrs, message):
    with_vm_xml(42, attrs)
    code, out, err = run("deploy", dfile(42), "h", "42", "h", stdin=deployment())
    assert code == 1 and message in err and out == ""
    assert "one-42" not in [d.name() for d in conn.listAllDomains()]
    assert Host(run.cfg()).assignments() == [] and Host(run.cfg()).guid_records() == []
    assert read(run.sriov(0) / "port") == ALL_F


def test_hpc_attribute_without_vf_nics_is_still_ours(run, conn):
    """A VM with no InfiniBand NIC but KVM_SRIOV_HPC = yes gets the profile
    (the deploy is not handed straight to the stock script)."""
    with_vm_xml(42, "<KVM_SRIOV_HPC>yes</KVM_SRIOV_HPC>")
    code, _, err = run("deploy", dfile(42), "h", "42", "h", stdin=deployment(nics=0))
    assert code == 0, err
    xml = etree.fromstring(conn.lookupByName("one-42").XMLDesc(0).encode())
    assert xml.find("numatune/memory").get("mode") == "strict"
    assert xml.find("devices/memballoon").get("model") == "none"
    assert "INFO: HPC profile: host-passthrough CPU" in err


@pytest.mark.parametrize("attr, pf", [("<KVM_SRIOV_NUMA>require</KVM_SRIOV_NUMA>", "0000:81:00.0"),
                                      ("<KVM_SRIOV_NUMA>ignore</KVM_SRIOV_NUMA>", "0000:03:00.0")])
def test_restore_keeps_the_numa_wish(run, conn, monkeypatch, tmp_path, attr, pf):
    """Restore gets no deployment file: the saved domain is still bound to its
    node (here node 1, as the HPC profile leaves it) and oned's action XML
    carries the VM's KVM_SRIOV_NUMA; the VF comes from that node unless 'ignore'."""
    import re
    from kvm_sriov.domain import domain_xml, hotplug
    from tests.conftest import FIXTURES
    plugged = []
    monkeypatch.setattr(hotplug, "attach", lambda dom, vfs, seconds, ports=None: plugged.extend(vfs))
    root = domain_xml.parse(deployment(nics=0).replace("<vcpu>", "<vcpu cpuset='4-7'>"))
    domain_xml.record_nics(root, [domain_xml.NicRecord("02:00:0a:64:00:2a", "ib-sriov")])
    ckpt = tmp_path / "datastores" / "0" / "42" / "checkpoint"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    conn.createXML(domain_xml.to_string(root), 0).save(str(ckpt))
    action = (FIXTURES / "opennebula" / "action-restore.xml").read_text()
    action = re.sub(r"<BASE_PATH>.*?</BASE_PATH>", f"<BASE_PATH>{ckpt.parent.parent}</BASE_PATH>", action)  # oned's own
    action = re.sub(r"<USER_TEMPLATE>", "<USER_TEMPLATE>" + attr, action, count=1)
    code, _, err = run("restore", str(ckpt), "h", UUID, "42", "h", stdin=action)
    assert code == 0, err
    assert [vf.pf for vf, _ in plugged] == [pf]
