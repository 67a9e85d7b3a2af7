"""Rung 1: config files, merge order and validation."""

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
