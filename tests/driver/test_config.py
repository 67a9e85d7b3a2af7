"""Rung 1: config files, merge order and validation."""

import os
from pathlib import Path

import pytest

from kvm_sriov import config
from kvm_sriov.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_shipped_file_equals_defaults():
    shipped = config.load(files=[REPO / "etc/vmm/kvm-sriov/kvm-sriov.toml"])
    defaults = config.load(files=[])
    assert shipped._asdict() | {"sources": ()} == defaults._asdict() | {"sources": ()}


def test_merge_order(tmp_path, monkeypatch):
    remotes = tmp_path / "remotes"
    (remotes / "etc/vmm/kvm-sriov").mkdir(parents=True)
    (remotes / "etc/vmm/kvm-sriov/kvm-sriov.toml").write_text(
        '[pool]\npfs = ["mlx5_0"]\n[libvirt]\nuri = "qemu:///a"\n')
    env = tmp_path / "env.toml"
    env.write_text('[libvirt]\nuri = "qemu:///b"\n')
    monkeypatch.setenv("KVM_SRIOV_CONFIG", str(env))
    monkeypatch.setattr(config, "HOST_CONFIG", tmp_path / "absent.toml")
    cfg = config.load(remotes)
    assert cfg.pfs == ("mlx5_0",) and cfg.libvirt_uri == "qemu:///b"
    assert len(cfg.sources) == 2


@pytest.mark.parametrize("text, message", [
    ("[pool]\npfs = 3\n", "pool.pfs must be list"),
    ("[pool]\nbogus = 1\n", "unknown key pool.bogus"),
    ("[nope]\n", "unknown section"),
    ("[timeouts]\nshutdown_seconds = 0\n", "must be > 0"),
    ("[pool]\nnuma_policy = 'maybe'\n", "numa_policy must be one of"),
    ("[pool]\nskip_vfs_in_host_use = 1\n", "must be bool"),
    ("[network]\nbridge = 'a:b'\n", "without ':'"),
    ("pool = [", "not valid TOML"),
])
def test_bad_config_is_refused(tmp_path, text, message):
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message):
        config.load(files=[f])


def test_env_pointing_nowhere(monkeypatch, tmp_path):
    monkeypatch.setenv("KVM_SRIOV_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(None)


def test_a_file_not_in_utf8_is_refused(tmp_path):
    f = tmp_path / "c.toml"
    f.write_bytes(b"[pool]\npfs = [\"\xff\"]\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(files=[f])


# -- whose files are read: the rule every entry point applies to the library ------------
NOBODY = 65534
RELOAD = '[infiniband]\nsm_reload_command = ["/bin/sh", "-c", "echo planted"]\n'


def another_users(path, how: str):
    """A config file another user could have changed, in one of the ways the rule refuses."""
    path.write_text(RELOAD)
    if how == "owned by another user":
        os.chown(path, NOBODY, NOBODY)
    elif how == "writable by another group":
        os.chown(path, 0, NOBODY)
        path.chmod(0o664)
    elif how == "writable by everybody":
        path.chmod(0o666)
    else:                                  # its folder: another user can replace it
        path.parent.chmod(0o777)
    return path


LOOSE = ["owned by another user", "writable by another group", "writable by everybody", "in a folder others can write"]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's files need root to make")


@needs_root
@pytest.mark.parametrize("how", LOOSE)
def test_a_file_another_user_could_change_is_not_read(tmp_path, how):
    (tmp_path / "etc").mkdir()
    f = another_users(tmp_path / "etc" / "kvm-sriov.toml", how)
    with pytest.raises(ConfigError, match=f"{f} is not read: .*(uid {NOBODY}|writable by group or others)"):
        config.load(files=[f])


@needs_root
@pytest.mark.parametrize("how", LOOSE)
def test_the_host_config_in_etc_passes_the_same_check(tmp_path, monkeypatch, how):
    """/etc/kvm-sriov/kvm-sriov.toml is found and read like every other file."""
    (tmp_path / "etc").mkdir()
    monkeypatch.setattr(config, "HOST_CONFIG", str(another_users(tmp_path / "etc" / "kvm-sriov.toml", how)))
    monkeypatch.delenv("KVM_SRIOV_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="is not read"):
        config.load(None)


@needs_root
def test_a_trusted_file_is_read_through_a_link_and_under_a_sticky_folder(tmp_path):
    """A sticky folder above the file (/tmp) is fine: others cannot replace
    what root made in it; a link (the package links the remotes' file to
    /etc/one/kvm-sriov) is followed, and where it leads is what is checked."""
    tmp_path.chmod(0o1777)
    real = tmp_path / "kvm-sriov.toml"
    real.write_text(RELOAD)
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    assert config.load(files=[link]).sm_reload_command == ("/bin/sh", "-c", "echo planted")
    real.chmod(0o646)
    with pytest.raises(ConfigError, match=f"{real} is writable by group or others"):
        config.load(files=[link])
