"""The kvm-sriov VM_MAD's defaults file is OpenNebula's own vmm_exec_kvm.conf
with kvm-sriov's values set in it: every stock attribute survives (OVMF_UEFIS:
oned refuses a UEFI VM without it), made by `rake install:oned_defaults` from
the stock file of the OpenNebula in use (here: the one in the source tarball)."""

import os
import shutil
import subprocess
import tarfile

import pytest

from kvm_sriov.oned import oned_defaults
from simhost import stock_kvm
from tests.conftest import REPO

ADDITIONS = REPO / "templates" / "oned" / "vmm_exec_kvm-sriov.conf"


@pytest.fixture(scope="module")
def stock_text():
    try:
        source = stock_kvm.tarball()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    with tarfile.open(source) as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith("src/vmm_mad/exec/x86_64/vmm_exec_kvm.conf")),
                      None)
        assert member is not None, f"{source} has no src/vmm_mad/exec/x86_64/vmm_exec_kvm.conf"
        return tar.extractfile(member).read().decode()


def flat(text, where):
    """(attribute, sub-attribute or None) -> value, for the first attribute of each name (oned's)."""
    out = {}
    for name, attr in oned_defaults.first(oned_defaults.parse(text, where)).items():
        if isinstance(attr.value, dict):
            out.update({(name, k): v for k, v in attr.value.items()})
        else:
            out[(name, None)] = attr.value
    return out


def test_every_stock_default_survives_and_ours_are_set(stock_text):
    stock = flat(stock_text, "stock")
    ours = flat(oned_defaults.merge(stock_text, ADDITIONS.read_text()), "generated")
    added = flat(ADDITIONS.read_text(), "additions")
    assert ("OVMF_UEFIS", None) in stock and ("SPICE_OPTIONS", None) in stock  # the real stock file was read
    assert {k: v for k, v in ours.items() if k in stock and k not in added} == \
        {k: v for k, v in stock.items() if k not in added}
    assert {k: ours.get(k) for k in added} == added
    assert set(ours) == set(stock) | set(added)
    assert ours[("CPU_MODEL", "MODEL")] == "host-passthrough" and ours[("OS", "MACHINE")] == "q35"


def test_stock_text_is_kept_line_for_line_outside_our_values(stock_text):
    """Comments and layout stay: an operator can diff it against the stock file."""
    out = oned_defaults.merge(stock_text, ADDITIONS.read_text())
    changed = [line for line in stock_text.splitlines() if line not in out.splitlines()]
    assert changed == ['    APIC   = "no",']  # the one stock value kvm-sriov changes


@pytest.mark.parametrize("stock, additions, expected", [
    ('A = "1"\n', 'A = "2"\n', 'A = "2"\n'),
    ('V = [ X = "1" ]\n', 'V = [ Y = "2" ]\n', 'V = [\n    Y = "2",\n X = "1" ]\n'),
    ('V = [\n  X = "1",\n# Z = "c"\n  Y = 1 ]\n', 'V = [ Y = "2" ]\n', 'V = [\n  X = "1",\n# Z = "c"\n  Y = "2" ]\n'),
    ('A = "x \\" # y"\n', 'B = "q"\n', 'A = "x \\" # y"\n\n# kvm-sriov\nB = "q"\n'),
    ('V = [ X = "1" ]\nV = [ X = "9" ]\n', 'V = [ X = "2" ]\n', 'V = [ X = "2" ]\nV = [ X = "9" ]\n'),
])
def test_merge_sets_values_in_place(stock, additions, expected):
    assert oned_defaults.merge(stock, additions) == expected
    assert flat(expected, "expected")  # still a template


@pytest.mark.parametrize("bad", ['A = "open', "A = [ B = 1", "= 1", "A 1", 'A = [ B = "1" C = 2 ]'])
def test_a_broken_file_is_refused(bad):
    with pytest.raises(oned_defaults.ParseError):
        oned_defaults.merge(bad, ADDITIONS.read_text())


def test_a_vector_against_a_single_value_is_refused():
    with pytest.raises(oned_defaults.ParseError):
        oned_defaults.merge('CPU_MODEL = "x"\n', ADDITIONS.read_text())


@pytest.mark.skipif(not shutil.which("rake"), reason="needs rake")
def test_rake_task_writes_it_next_to_the_stock_file(tmp_path, stock_text):
    etc = tmp_path / "etc"
    (etc / "vmm_exec").mkdir(parents=True)
    (etc / "vmm_exec" / "vmm_exec_kvm.conf").write_text(stock_text)
    subprocess.run(["rake", "install:oned_defaults", f"ONE_ETC={etc}"], cwd=REPO, check=True,
                   capture_output=True, timeout=120)
    out = etc / "vmm_exec" / "vmm_exec_kvm-sriov.conf"
    assert flat(out.read_text(), "installed") == flat(oned_defaults.merge(stock_text, ADDITIONS.read_text()), "m")
    assert oct(out.stat().st_mode & 0o777) == "0o644"


@pytest.mark.skipif(not shutil.which("rake"), reason="needs rake")
def test_rake_task_without_a_stock_file_fails_and_writes_nothing(tmp_path):
    p = subprocess.run(["rake", "install:oned_defaults", f"ONE_ETC={tmp_path / 'etc'}"], cwd=REPO,
                       capture_output=True, text=True, timeout=120, env={**os.environ})
    assert p.returncode != 0 and "vmm_exec_kvm.conf not found" in p.stderr
    assert not (tmp_path / "etc").exists()
