"""deploy says in the VM's log when the stock kvm scripts are of an
OpenNebula release kvm-sriov was not tested with (remotes/VERSION)."""

from types import SimpleNamespace

from kvm_sriov.actions import lifecycle


def _said(tmp_path, capsys, version):
    if version is not None:
        (tmp_path / "VERSION").write_text(version + "\n")
    lifecycle._untested_stock(SimpleNamespace(remotes_dir=tmp_path))
    return capsys.readouterr().err


def test_an_untested_release_is_said_once_a_tested_one_or_none_is_not(tmp_path, capsys):
    assert "WARN" in _said(tmp_path, capsys, "6.10.0") and "6.10" in _said(tmp_path, capsys, "6.10.0")
    assert _said(tmp_path, capsys, "7.4.0") == ""
    (tmp_path / "VERSION").unlink()
    assert _said(tmp_path, capsys, None) == ""
