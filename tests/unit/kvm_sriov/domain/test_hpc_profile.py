"""Rung 1: the HPC profile's XML (validated by libvirt's own schema with
virt-xml-validate) and the per-VM options element."""

import shutil
import subprocess
from xml.etree import ElementTree as etree

import pytest

from kvm_sriov.domain import hpc_profile
from kvm_sriov.errors import InputError
from tests.conftest import FIXTURES

DEPLOYMENT = (FIXTURES / "opennebula" / "deployment.0").read_text()


def validate(tmp_path, root):
    """libvirt's RelaxNG schema; OpenNebula writes a second <devices> block
    (libvirt's parser reads both, its schema wants one), so merge them first."""
    root = etree.fromstring(etree.tostring(root))
    blocks = root.findall("devices")
    for extra in blocks[1:]:
        blocks[0].extend(list(extra))
        root.remove(extra)
    path = tmp_path / "domain.xml"
    path.write_text(etree.tostring(root, encoding="unicode"))
    done = subprocess.run(["virt-xml-validate", str(path), "domain"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


needs_validator = pytest.mark.skipif(shutil.which("virt-xml-validate") is None,
                                     reason="virt-xml-validate (libvirt-clients) missing")


@needs_validator
def test_fixture_is_valid_to_begin_with(tmp_path):
    validate(tmp_path, etree.fromstring(DEPLOYMENT.encode()))


@needs_validator
@pytest.mark.parametrize("size", [0, 1048576])
def test_hpc_xml_is_valid_libvirt(tmp_path, size):
    root = etree.fromstring(DEPLOYMENT.encode())
    root.find("devices").append(etree.fromstring("<memballoon model='virtio'/>"))
    done = hpc_profile.apply(root, 1, {4, 5, 6, 7}, hugepages=True, hugepage_size_kib=size)
    validate(tmp_path, root)
    assert [p.get("cpuset") for p in root.findall("cputune/vcpupin")] == ["4", "5", "6", "7"]
    assert root.find("cputune/emulatorpin").get("cpuset") == "4-7"
    assert root.find("cputune/shares").text == "400"          # OpenNebula's value kept
    assert root.find("numatune/memory").attrib == {"mode": "strict", "nodeset": "1"}
    assert [b.get("model") for b in root.iter("memballoon")] == ["none"]
    page = root.find("memoryBacking/hugepages/page")
    assert (page is not None) == bool(size)
    assert any("hugepages" in line for line in done)


@needs_validator
def test_hpc_keeps_opennebula_pinning(tmp_path):
    root = etree.fromstring(DEPLOYMENT.encode())
    tune = root.find("cputune")
    for i in range(4):
        etree.SubElement(tune, "vcpupin", vcpu=str(i), cpuset=str(6 - i % 2))
    etree.SubElement(root, "numatune").append(etree.fromstring("<memory mode='preferred' nodeset='1'/>"))
    done = hpc_profile.apply(root, 1, {4, 5, 6, 7}, hugepages=False)
    validate(tmp_path, root)
    assert [p.get("cpuset") for p in root.findall("cputune/vcpupin")] == ["6", "5", "6", "5"]
    assert root.find("numatune/memory").attrib == {"mode": "strict", "nodeset": "1"}
    assert root.find("memoryBacking") is None
    assert "vCPU pins from OpenNebula kept" in done


def test_more_vcpus_than_node_cpus_warns():
    root = etree.fromstring("<domain><vcpu>6</vcpu><devices/></domain>")
    done = hpc_profile.apply(root, 0, {0, 1})
    assert [p.get("cpuset") for p in root.findall("cputune/vcpupin")] == ["0", "1", "0", "1", "0", "1"]
    assert any(line.startswith("WARNING: 6 vCPUs share") for line in done)


def test_options_taken_from_top_level_or_metadata():
    ns = "xmlns:sriov='urn:kvm-sriov:metadata:1'"
    root = etree.fromstring(f"<domain><sriov:options {ns} hpc='YES' numa='require'/></domain>")
    assert hpc_profile.take_options(root) == hpc_profile.VmOptions(True, "require")
    assert len(root) == 0
    root = etree.fromstring(f"<domain><metadata><sriov:options {ns} hpc='no'/></metadata></domain>")
    assert hpc_profile.take_options(root) == hpc_profile.VmOptions(False, None)
    assert hpc_profile.take_options(etree.fromstring("<domain/>")) == hpc_profile.VmOptions()
    with pytest.raises(InputError):
        hpc_profile.take_options(etree.fromstring(f"<domain><sriov:options {ns} hpc='maybe'/></domain>"))


def test_the_raw_metadata_wrapper_goes_with_the_options_and_openebulas_metadata_stays():
    """oned 7.4 wants RAW data wrapped in <metadata>; it is written before
    OpenNebula's own <metadata>, and libvirt keeps only one: the emptied
    wrapper must not be the one left."""
    ns = "xmlns:sriov='urn:kvm-sriov:metadata:1'"
    root = etree.fromstring(f"<domain><metadata><sriov:options {ns} hpc='yes'/></metadata>"
                            "<metadata><one:vm xmlns:one='http://opennebula.org/xmlns/libvirt/1.0'/></metadata>"
                            "</domain>")
    assert hpc_profile.take_options(root) == hpc_profile.VmOptions(True, None)
    [meta] = root.findall("metadata")
    assert len(meta) == 1 and meta[0].tag.endswith("vm")
