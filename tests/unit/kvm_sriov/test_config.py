"""Rung 1: config files, merge order and validation; the file format is TOML
as tomllib reads it: comments, strings, arrays and tables in any valid
spelling give the same Config; invalid TOML, a value of the wrong type or
shape, an unknown section or key is one ConfigError line naming the file,
never another exception."""

import os
import random
from pathlib import Path

import pytest

from kvm_sriov import config
from kvm_sriov.errors import ConfigError
from tests.conftest import REPO


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


# -- the TOML format ------------------------------------------------------------
PLAIN = ('[pool]\npfs = ["mlx5_0", "0000:81:00.0"]\nstate_dir = "/srv/kvm-sriov"\n'
         'reservation_grace_seconds = 0\n[timeouts]\nshutdown_seconds = 1000\n')


def load_text(tmp_path, text, name="c.toml"):
    f = tmp_path / name
    f.write_bytes(text.encode() if isinstance(text, str) else text)
    return config.load(files=[f])


# The same settings as PLAIN, in the TOML a person may write: comments
# anywhere, literal/escaped/multi-line strings, multi-line arrays with a
# trailing comma, dotted keys, inline and super-tables, other integer
# spellings, CRLF line ends.
SPELLINGS = [
    PLAIN,
    "# a comment\n[pool] # after a header\npfs = [ 'mlx5_0' , \"0000:81:00.0\", ] # after an array\n"
    "state_dir = '/srv/kvm-sriov'\nreservation_grace_seconds = +0\n\n[ timeouts ]\n\tshutdown_seconds\t=\t1000\n",
    '[pool]\npfs = [\n  "mlx5_0",  # the first\n  "0000:81:00.0",\n]\nstate_dir = "\\u002Fsrv\\/kvm-sriov"\n'
    'reservation_grace_seconds = -0\n[timeouts]\nshutdown_seconds = 1_000\n'.replace("\\/", "/"),
    'pool.pfs = ["mlx5_0", """0000:81:00.0"""]\npool.state_dir = \'\'\'/srv/kvm-sriov\'\'\'\n'
    'pool.reservation_grace_seconds = 0x0\ntimeouts = { shutdown_seconds = 0o1750 }\n',
    '[pool]\n"pfs" = ["mlx5_0", "0000:81:00.0"]\nstate_dir = "/srv/kvm-sriov"\n'
    'reservation_grace_seconds = 0.0\n[timeouts]\nshutdown_seconds = 1e3\n',
    PLAIN.replace("\n", "\r\n"),
]


@pytest.mark.parametrize("text", SPELLINGS)
def test_any_valid_spelling_gives_the_same_config(tmp_path, text):
    cfg = load_text(tmp_path, text)
    assert cfg._replace(sources=()) == load_text(tmp_path, PLAIN, "plain.toml")._replace(sources=())
    assert cfg.pfs == ("mlx5_0", "0000:81:00.0") and cfg.state_dir == Path("/srv/kvm-sriov")
    assert cfg.shutdown_seconds == 1000.0 and cfg.reservation_grace_seconds == 0.0


def test_the_shipped_file_is_valid_toml_with_every_key():
    """Documents every key it sets with its default (test_config checks the values)."""
    import tomllib
    shipped = tomllib.loads((REPO / "etc/vmm/kvm-sriov/kvm-sriov.toml").read_text())
    assert set(shipped) == set(config.DEFAULTS)
    for section, values in shipped.items():
        assert set(values) <= set(config.DEFAULTS[section]), section


def test_a_string_keeps_what_is_not_a_comment(tmp_path):
    cfg = load_text(tmp_path, "[network]\nbridge = 'ib#not a comment' # a comment\n")
    assert cfg.bridge == "ib#not a comment"


INVALID_TOML = [
    "[pool]\npfs = [\n", "pool = [", "a = 1\na = 2\n", "[pool]\n[pool]\n", "[pool]\nreservation_grace_seconds = 01\n",
    "[pool]\nstate_dir = \n", "[pool]\nskip_vfs_in_host_use = tru\n", "[pool]\nreservation_grace_seconds = 1 2\n",
    "[pool] x\n", "[pool]\nstate_dir = 'x\n", "[pool]\npfs = [1\n", "= 1\n", "[pool]\nstate_dir = \"a\\qb\"\n",
    "[pool]\nstate_dir = \"a\x01b\"\n", "[pool]\nstate_dir = '''x\n", "[pool\n", "[[pool]\n",
    "a = 1979-13-27\n", "a = {x = 1,}\n",
    "a = " + "[" * 5000 + "]" * 5000 + "\n",   # nested past the interpreter's recursion limit
    "a = " + "{b=" * 5000 + "1" + "}" * 5000 + "\n",
]


@pytest.mark.parametrize("text", INVALID_TOML)
def test_invalid_toml_is_one_line_naming_the_file(tmp_path, text):
    with pytest.raises(ConfigError, match="not valid TOML") as caught:
        load_text(tmp_path, text)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'c.toml'}: not valid TOML: ") and "\n" not in message


def test_a_file_not_in_utf8_is_one_line_naming_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"c\.toml: not valid TOML: .*utf-8"):
        load_text(tmp_path, b"[pool]\nbridge = '\xff'\n")


# Valid TOML that is not a valid config: the loader's checks, one line each.
WRONG = [
    ("[[pool]]\npfs = []\n", "[pool] must be a table"),
    ("pool = 1\n", "[pool] must be a table"),
    ("[pool.sub]\n", "unknown key pool.sub"),
    ("[pool]\nbogus = 1\n", "unknown key pool.bogus"),
    ("[nope]\n", "unknown section [nope]"),
    ("top = 1\n", "unknown section [top]"),
    ("[pool]\nstate_dir = 1979-05-27\n", "pool.state_dir must be str, got datetime.date"),
    ("[pool]\nstate_dir = 07:32:00\n", "pool.state_dir must be str, got datetime.time"),
    ("[pool]\nstate_dir = {a = 1}\n", "pool.state_dir must be str"),
    ("[pool]\npfs = 'mlx5_0'\n", "pool.pfs must be list"),
    ("[pool]\npfs = [1, 2]\n", "pool.pfs must be a list of non-empty strings"),
    ("[pool]\npfs = [{a = 1}]\n", "pool.pfs must be a list of non-empty strings"),
    ("[pool]\nexclude_vfs = [[1]]\n", "is not a PCI address"),
    ("[pool]\nskip_vfs_in_host_use = 1\n", "must be bool"),
    ("[timeouts]\nlock_seconds = true\n", "timeouts.lock_seconds must be int"),
    ("[timeouts]\nlock_seconds = '60'\n", "timeouts.lock_seconds must be int"),
    ("[timeouts]\nlock_seconds = -inf\n", "timeouts.lock_seconds must be a finite number"),
    ("[timeouts]\nlock_seconds = inf\n", "timeouts.lock_seconds must be a finite number"),
    ("[timeouts]\nhotplug_seconds = nan\n", "timeouts.hotplug_seconds must be a finite number"),
    ("[pool]\nreservation_grace_seconds = nan\n", "pool.reservation_grace_seconds must be a finite number"),
    ("[infiniband]\npkeys_per_user = 1.5\n", "infiniband.pkeys_per_user must be a whole number"),
    ("[infiniband]\nsm_push_seconds = nan\n", "infiniband.sm_push_seconds must be a finite number"),
    ("[migration]\npeer_command = []\n", "peer_command must be a non-empty list of strings"),
    ("[ivshmem]\nmax_region_mb = 0x10001\n", "max_region_mb must be a whole number of MB from 1 to 65536"),
]


@pytest.mark.parametrize("text, message", WRONG)
def test_valid_toml_that_is_not_a_valid_config_is_one_line(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")) as caught:
        load_text(tmp_path, text)
    assert "\n" not in str(caught.value)


VALID = SPELLINGS[:4] + [
    '[infiniband]\npkey_range = "0x1000-0x1fff"\nsm_reload_command = ["systemctl", "reload", "opensm"]\n'
    '[migration]\npeer_command = ["ssh", "{host}"]\nlive = false\n[ivshmem]\nmax_region_mb = 64\n']
REFUSED = [text for text, _ in WRONG] + INVALID_TOML[:-2]


def test_random_edits_give_a_config_or_one_config_error(tmp_path):
    """Whatever a file says, the loader returns a Config or raises ConfigError
    with one line: never another exception (a traceback to the operator)."""
    rnd = random.Random(28)
    alphabet = list(" \t\n#=[]{},.\"'+-_:01239afxinetrue\\é\r\x00")
    f = tmp_path / "c.toml"
    outcomes = {"config": 0, "error": 0}
    for _ in range(2000):
        text = list(rnd.choice(VALID if rnd.random() < 0.5 else REFUSED))
        for _ in range(rnd.randint(1, 3)):
            i = rnd.randrange(len(text) + 1)
            if text and rnd.random() < 0.4:
                del text[min(i, len(text) - 1)]
            else:
                text.insert(i, rnd.choice(alphabet))
        f.write_text("".join(text))
        try:
            assert isinstance(config.load(files=[f]), config.Config)
            outcomes["config"] += 1
        except ConfigError as exc:
            assert "\n" not in str(exc), repr("".join(text))
            outcomes["error"] += 1
    assert min(outcomes.values()) > 100, outcomes  # both ends reached
