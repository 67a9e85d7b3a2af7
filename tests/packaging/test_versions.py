"""kvm_sriov/oned/versions.py: the stock kvm scripts' OpenNebula version (the
remotes' VERSION file, as OpenNebula's install and `onehost sync` keep it)
checked against supported-opennebula.txt."""

import pytest

from kvm_sriov.oned import versions
from simhost import stock_kvm


def remotes_with(tmp_path, content):
    (tmp_path / "VERSION").write_bytes(content)
    return tmp_path


def test_the_tested_versions_are_listed():
    assert versions.supported() == ["7.4"]


def test_the_real_74_remotes_are_supported(tmp_path):
    try:
        import tarfile
        with tarfile.open(stock_kvm.tarball()) as tar:
            m = next(m for m in tar.getmembers() if m.name.endswith("src/im_mad/remotes/VERSION"))
            data = tar.extractfile(m).read()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    assert versions.warning(remotes_with(tmp_path, data)) is None
    assert versions.stock_version(tmp_path) == "7.4.0"


@pytest.mark.parametrize("content, version", [(b"7.4.1\n", "7.4.1"), (b"7.4\n", "7.4"), (b"7.4.0.1\n", "7.4.0.1")])
def test_patch_releases_of_a_tested_version_pass(tmp_path, content, version):
    assert versions.stock_version(remotes_with(tmp_path, content)) == version
    assert versions.warning(tmp_path) is None


def test_another_version_is_warned_about_in_one_line(tmp_path):
    note = versions.warning(remotes_with(tmp_path, b"7.6.0\n"))
    assert "OpenNebula 7.6.0" in note and "tested with 7.4" in note and "\n" not in note


@pytest.mark.parametrize("content", [b"", b"latest\n", b"7.4.0" + b"x" * 400, b"\xff\xfe", b"7.4.0\n$(reboot)\n"])
def test_a_version_file_that_is_no_version_is_said_so(tmp_path, content):
    note = versions.warning(remotes_with(tmp_path, content))
    assert note.startswith("kvm-sriov: cannot tell") and len(note) < 300


def test_no_version_file(tmp_path):
    assert "cannot tell" in versions.warning(tmp_path)
