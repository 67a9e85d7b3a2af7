"""libvirt is imported by the first Hypervisor, not by importing the library:
an action on a VM without VFs hands over to the stock script without a
connection, and the import alone is the largest part of its start-up. Once
imported, libvirt's errors still stay off stderr (OpenNebula would take
them for the failure reason). Each case runs in a fresh interpreter: this
one has libvirt loaded already."""

import subprocess
import sys

from tests.conftest import REPO


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n" + code],
                          capture_output=True, text=True, timeout=60)


def test_no_module_of_the_library_imports_libvirt():
    p = run("import importlib, pkgutil, kvm_sriov\n"
            "for m in pkgutil.walk_packages(kvm_sriov.__path__, 'kvm_sriov.'):\n"
            "    importlib.import_module(m.name)\n"
            "print('libvirt' in sys.modules)")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


def test_the_first_hypervisor_imports_it_and_keeps_its_errors_off_stderr():
    p = run("from kvm_sriov.domain.hypervisor import Hypervisor\n"
            "from kvm_sriov.errors import HypervisorError\n"
            "h = Hypervisor('test:///default')\n"
            "assert 'libvirt' in sys.modules\n"
            "assert h.lookup('no-such-domain') is None\n"
            "dom = h.lookup('test')\n"
            "assert Hypervisor.is_active(dom)\n"
            "try:\n"
            "    Hypervisor('qemu+unix:///system?socket=/nonexistent/sock').conn\n"
            "except HypervisorError as exc:\n"
            "    print(str(exc).splitlines()[0])\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("cannot connect to libvirt at qemu+unix:///system?socket=/nonexistent/sock")
    assert p.stderr == ""  # libvirt printed nothing itself


def test_a_static_call_before_any_hypervisor_works():
    """is_active takes a domain from any connection: libvirt is loaded for it."""
    p = run("import libvirt\n"
            "dom = libvirt.open('test:///default').lookupByName('test')\n"
            "from kvm_sriov.domain.hypervisor import Hypervisor\n"
            "dom.destroy()\n"
            "print(Hypervisor.is_active(dom))")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"
