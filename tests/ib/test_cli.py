"""The admin CLI as an administrator runs it: bin/kvm-sriov in its own
process, on the fake host, with libvirt's test driver for the libvirt parts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvm_sriov import config
from kvm_sriov.ib import opensm_check
from kvm_sriov.node.host import Allocation, Host
from kvm_sriov.vf.policy import VfRequest

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "bin" / "kvm-sriov"
GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture
def site(fake_host, tmp_path):
    root = fake_host["root"]
    (root / "proc").mkdir()
    (root / "proc" / "cmdline").write_text("BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt\n")
    (root / "sys/bus/pci/drivers/vfio-pci").mkdir(parents=True)
    sm = tmp_path / "opensm.conf"
    sm.write_text(f"# opensm\nvirt_enabled 2\npartition_config_file {tmp_path / 'partitions.conf'}\n")
    reload_log = tmp_path / "reloads"
    reload_cmd = tmp_path / "reload-sm"
    reload_cmd.write_text(f"#!/bin/sh\necho \"$@\" >> {reload_log}\n")
    reload_cmd.chmod(0o755)
    conf = tmp_path / "kvm-sriov.toml"
    conf.write_text(f"""
[sysfs]
root = "{root}"
[pool]
pfs = ["mlx5_0", "mlx4_0"]
state_dir = "{tmp_path / 'state'}"
[libvirt]
uri = "test:///default"
[infiniband]
partitions_file = "{tmp_path / 'partitions.conf'}"
sm_config = "{sm}"
sm_reload_command = ["{reload_cmd}", "HUP"]
""")

    def run(*args):
        env = dict(os.environ, KVM_SRIOV_CONFIG=str(conf))
        done = subprocess.run([sys.executable, str(CLI), *args], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=60)
        return done.returncode, done.stdout, done.stderr

    run.config = config.load(files=[conf])
    run.tmp = tmp_path
    run.reload_log = reload_log
    return run


def give_vm_a_vf(cfg, vm_id=42, vf="0000:03:00.1", mac="02:00:0a:64:00:2a"):
    host = Host(cfg)
    with host.pool.transaction() as txn:
        txn.add(vf, "0000:03:00.0", vm_id, f"one-{vm_id}", mac, "attached", "deploy")
    host.program_guids(vm_id, [Allocation(VfRequest(mac), host.inventory.vf(vf))])
    host.close()


def test_status_empty_and_with_a_vm(site):
    code, out, err = site("status")
    assert code == 0, err
    assert "0000:03:00.0  mlx5_0  ib0     0     4    3       3" in out
    assert "no VF is assigned" in out
    give_vm_a_vf(site.config)
    code, out, err = site("status")
    assert code == 0, err
    assert "0000:03:00.1  42  one-42  02:00:0a:64:00:2a  02:00:0a:00:00:64:00:2a  attached" in out
    code, out, _ = site("status", "--json")
    data = json.loads(out)
    assert data["assignments"][0]["port_guid"] == "02:00:0a:00:00:64:00:2a"
    assert {p["pf"]: p["free"] for p in data["pfs"]}["0000:03:00.0"] == 2



def test_status_shows_a_pf_held_whole(site):
    """A PF passed through whole has no VFs while a VM holds it: status says which VM, and how many VFs
    it gets back after."""
    host = Host(site.config)
    with host.pool.transaction() as txn:
        txn.add_pf("0000:03:00.0", 43, "one-43", "02:00:0a:64:00:2b", "attached", "deploy", num_vfs=4)
    host.close()
    code, out, err = site("status")
    assert code == 0, err
    line = next(l for l in out.splitlines() if l.startswith("0000:03:00.0  43"))
    assert line.split()[:5] == ["0000:03:00.0", "43", "one-43", "02:00:0a:64:00:2b", "attached"]
    assert line.split()[-1] == "4" and "WHOLE PF" in out and "no VF is assigned" in out
    code, out, _ = site("status", "--json")
    whole = json.loads(out)["whole_pfs"]
    assert [(w["pf"], w["vm"], w["state"], w["vfs_after"]) for w in whole] == [("0000:03:00.0", 43, "attached", 4)]


def test_guids_and_mismatch(site, fake_host):
    give_vm_a_vf(site.config)
    code, out, err = site("guids")
    assert code == 0 and "02:00:0a:00:00:64:00:2a" in out and "ok" in out, out + err
    (fake_host["fs"].dev("0000:03:00.0") / "sriov/0/port").write_text("11:11:11:11:11:11:11:11\n")
    code, out, _ = site("guids")
    assert code == 1 and "MISMATCH" in out


def test_reconcile_dry_run_then_for_real(site, fake_host):
    give_vm_a_vf(site.config)      # one-42 does not run in the test driver: stale
    code, out, err = site("reconcile", "--dry-run")
    assert code == 0, err
    assert "would free" in out and "would restore GUID 02:00:0a:00:00:64:00:2a of VF 0000:03:00.1" in out
    assert (fake_host["fs"].dev("0000:03:00.0") / "sriov/0/port").read_text().strip() != "ff:ff:ff:ff:ff:ff:ff:ff"
    code, out, err = site("reconcile")
    assert code == 0, err
    assert "did restore GUID" in out
    assert (fake_host["fs"].dev("0000:03:00.0") / "sriov/0/port").read_text().strip() == "ff:ff:ff:ff:ff:ff:ff:ff"
    assert "nothing to do" in site("reconcile")[1]


def test_doctor_on_a_ready_fake_host(site):
    code, out, err = site("doctor")
    assert code == 0, out + err
    assert "[OK  ] IOMMU on the kernel command line" in out
    assert "[WARN] PF 0000:03:00.0 (mlx5_0)" in out           # 03:00.3 is in use on the host
    assert "[OK  ] opensm virtualization" in out
    assert "[OK  ] libvirt" in out


def test_doctor_says_what_to_fix(site):
    (site.config.sysfs_root / "proc/cmdline").write_text("root=/dev/sda1\n")
    site.config.sm_config.write_text("virt_enabled 0\n")
    code, out, _ = site("doctor")
    assert code == 1
    assert "fix: add 'intel_iommu=on iommu=pt' to GRUB_CMDLINE_LINUX" in out
    assert "fix: set 'virt_enabled 2' in" in out


def test_doctor_vfs_disabled(site, fake_host):
    (fake_host["fs"].dev("0000:03:00.0") / "sriov_numvfs").write_text("0\n")
    for n in range(4):
        (fake_host["fs"].dev("0000:03:00.0") / f"virtfn{n}").unlink()
    code, out, _ = site("doctor")
    assert code == 1 and "echo 8 > /sys/bus/pci/devices/0000:03:00.0/sriov_numvfs" in out


def test_doctor_firmware_without_vfs_names_mlxconfig(site, fake_host):
    dev = fake_host["fs"].dev("0000:03:00.0")
    (dev / "sriov_numvfs").write_text("0\n")
    (dev / "sriov_totalvfs").write_text("0\n")
    for n in range(4):
        (dev / f"virtfn{n}").unlink()
    code, out, _ = site("doctor")
    assert code == 1 and "mlxconfig -d 0000:03:00.0 set SRIOV_EN=1" in out and "echo 0 >" not in out


def test_partitions_prints_the_file_and_nothing_else(site):
    """What Puppet's exec (and any `> file`) takes: stdout is the file."""
    code, out, err = site("partitions", "--from-xml", str(GOLDEN / "vnpool.xml"))
    assert code == 0, err
    assert out == (GOLDEN / "partitions.conf").read_text()
    assert not (site.tmp / "partitions.conf").exists()


@pytest.mark.skipif(not opensm_check.available(), reason="needs opensm, ibsim-utils, libumad2sim0")
def test_partitions_write_check_reload(site):
    xml = str(GOLDEN / "vnpool.xml")
    code, out, err = site("partitions", "--from-xml", xml, "--write", "--reload")
    assert code == 0, err
    assert out == "" and "2 network(s), 7 port GUID(s), written" in err
    assert (site.tmp / "partitions.conf").read_text() == (GOLDEN / "partitions.conf").read_text()
    assert site.reload_log.read_text() == "HUP\n"
    code, out, err = site("partitions", "--from-xml", xml, "--write", "--reload")
    assert "unchanged" in err and site.reload_log.read_text() == "HUP\n"   # no needless sweep
    assert site("partitions", "--from-xml", xml, "--check")[0] == 0   # the SM node (here) enforces oned's
    (site.tmp / "partitions.conf").write_text("old\n")
    code, out, err = site("partitions", "--from-xml", xml, "--check")
    assert code == 2 and "the SM node: unreadable: partitions file: 'old' has no closing ';'" in out
    assert site("partitions", "--from-xml", xml, "--check", "--output", str(site.tmp / "partitions.conf"))[0] == 1
    code, out, err = site("partitions", "--from-xml", xml, "--reload")   # as cron jobs call it: writes too
    assert code == 0 and out == "" and "written" in err and site.reload_log.read_text() == "HUP\nHUP\n"


@pytest.mark.skipif(not opensm_check.available(), reason="needs opensm, ibsim-utils, libumad2sim0")
def test_partitions_validate_asks_the_real_opensm(site):
    good = site.tmp / "good.conf"
    good.write_text((GOLDEN / "partitions.conf").read_text())
    assert site("partitions", "--validate", str(good))[0] == 0
    summary = site.tmp / "summary.conf"   # what the old command printed, once taken for the file
    summary.write_text("/etc/opensm/partitions.conf: 2 network(s), 7 port GUID(s), unchanged\n")
    code, out, err = site("partitions", "--validate", str(summary))
    assert code == 1 and "PARSE ERROR" in err and "opensm rejects" in err and out == ""


def test_partitions_from_a_stand_in_oned(site):
    """oned's XML-RPC API (one.vnpool.info) served by a stand-in on loopback."""
    import threading
    from xmlrpc.server import SimpleXMLRPCServer
    calls = []
    server = SimpleXMLRPCServer(("127.0.0.1", 0), logRequests=False, allow_none=True)

    def vnpool_info(session, who, start, end):
        calls.append((session, who, start, end))
        return [True, (GOLDEN / "vnpool.xml").read_text(), 0]
    server.register_function(vnpool_info, "one.vnpool.info")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/RPC2"
        code, out, err = site("partitions", "--endpoint", endpoint, "--session", "oneadmin:pw", "--stdout")
    finally:
        server.shutdown()
    assert code == 0, err
    assert out == (GOLDEN / "partitions.conf").read_text()
    assert calls == [("oneadmin:pw", -2, -1, -1)]


def test_partitions_without_credentials(site, monkeypatch):
    code, _, err = site("partitions", "--endpoint", "http://127.0.0.1:9/RPC2")
    assert code == 1 and "no OpenNebula credentials" in err


def test_usage_errors():
    done = subprocess.run([sys.executable, str(CLI), "frobnicate"], capture_output=True, text=True)
    assert done.returncode == 2


def plant_library(where: Path, marker: Path) -> Path:
    """A kvm_sriov package whose CLI only leaves a marker: proof it was imported."""
    pkg = where / "kvm_sriov"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text(f"def main():\n    open({str(marker)!r}, 'w').close()\n    return 0\n")
    return where


def chown_tree(top: Path, uid: int) -> None:
    for p in [top, *top.rglob("*")]:
        os.lchown(p, uid, uid)


def test_the_cli_never_imports_a_library_another_user_could_have_planted(tmp_path):
    """bin/kvm-sriov runs as root (Puppet): a library found under a directory
    another user made (as /var/tmp/one can be), or writable by others, is
    never imported; one only root could have written is."""
    import shutil
    bindir = tmp_path / "bin"              # the script outside any checkout, as the tools package has it
    bindir.mkdir()
    shutil.copy(CLI, bindir / "kvm-sriov")
    shutil.copy(REPO / "kvm_sriov_bootstrap.py", tmp_path)
    shared = tmp_path / "shared"           # world-writable and sticky, like /var/tmp
    shared.mkdir()
    shared.chmod(0o1777)
    cases = {
        "made by another user": plant_library(shared / "one" / "lib", tmp_path / "ran-1"),
        "writable by others": plant_library(tmp_path / "loose", tmp_path / "ran-2"),
        "a module writable by others": plant_library(tmp_path / "loose-module", tmp_path / "ran-3"),
        "writable by another group": plant_library(tmp_path / "group", tmp_path / "ran-4"),
    }
    chown_tree(shared / "one", 65534)
    (tmp_path / "loose").chmod(0o777)
    (tmp_path / "loose-module" / "kvm_sriov" / "cli.py").chmod(0o666)
    os.chown(tmp_path / "group" / "kvm_sriov", 0, 65534)
    (tmp_path / "group" / "kvm_sriov").chmod(0o775)
    for n, (what, lib) in enumerate(cases.items(), 1):
        done = subprocess.run(["/usr/bin/python3", str(bindir / "kvm-sriov"), "status"], capture_output=True,
                              text=True, env=dict(os.environ, KVM_SRIOV_LIB=str(lib)), timeout=60)
        assert not (tmp_path / f"ran-{n}").exists(), f"imported a library {what}"
        if done.returncode:
            assert "uid 65534" in done.stderr or "writable by group or others" in done.stderr, done.stderr
    trusted = plant_library(tmp_path / "trusted", tmp_path / "ran-ok")
    (trusted / "kvm_sriov").chmod(0o775)   # group root may write: administrators
    done = subprocess.run(["/usr/bin/python3", str(bindir / "kvm-sriov"), "status"], capture_output=True,
                          text=True, env=dict(os.environ, KVM_SRIOV_LIB=str(trusted)), timeout=60)
    assert done.returncode == 0 and (tmp_path / "ran-ok").exists(), done.stderr


# -- config files the CLI reads as root: the rule the library passes (kvm_sriov_bootstrap.untrusted) --
NOBODY = 65534
LOOSE = ["owned by another user", "writable by another group", "writable by everybody",
         "in a folder others can write"]


def loose_copy(conf: Path, where: Path, how: str) -> Path:
    """The site's config (it names sm_reload_command) where another user could change it."""
    where.mkdir()
    f = where / "kvm-sriov.toml"
    f.write_text(conf.read_text())
    if how == "owned by another user":
        os.chown(f, NOBODY, NOBODY)
    elif how == "writable by another group":
        os.chown(f, 0, NOBODY)
        f.chmod(0o664)
    elif how == "writable by everybody":
        f.chmod(0o666)
    else:
        where.chmod(0o777)
    return f


def reload_partitions(site) -> list:
    return ["partitions", "--from-xml", str(GOLDEN / "vnpool.xml"), "--output", str(site.tmp / "out.conf"),
            "--reload", "--force-reload"]


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's files need root to make")
@pytest.mark.parametrize("how", LOOSE)
@pytest.mark.parametrize("named_by", ["--config", "$KVM_SRIOV_CONFIG"])
def test_root_never_runs_a_command_from_a_config_another_user_could_change(site, how, named_by):
    """--config F and $KVM_SRIOV_CONFIG as root ran F's sm_reload_command
    whoever owned F: now F is refused in one line and nothing of it runs."""
    loose = loose_copy(site.tmp / "kvm-sriov.toml", site.tmp / "theirs", how)
    empty = site.tmp / "empty.toml"
    empty.touch()
    extra, env_conf = (["--config", str(loose)], empty) if named_by == "--config" else ([], loose)
    done = subprocess.run([sys.executable, str(CLI), *extra, *reload_partitions(site)], capture_output=True,
                          text=True, env=dict(os.environ, KVM_SRIOV_CONFIG=str(env_conf)), cwd=site.tmp, timeout=60)
    assert not site.reload_log.exists(), "ran a command another user's config named"
    assert done.returncode == 1 and done.stdout == ""
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"kvm-sriov partitions: {loose} is not read: " in done.stderr, done.stderr
    assert f"uid {NOBODY}" in done.stderr or "writable by group or others" in done.stderr, done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's files need root to make")
@pytest.mark.parametrize("how", LOOSE)
def test_root_never_runs_a_command_from_a_host_config_another_user_could_change(site, how, monkeypatch, capsys):
    """/etc/kvm-sriov/kvm-sriov.toml, which the CLI finds by itself, passes the same check."""
    from kvm_sriov import cli
    monkeypatch.setattr(config, "HOST_CONFIG", str(loose_copy(site.tmp / "kvm-sriov.toml", site.tmp / "etc", how)))
    monkeypatch.setattr(cli, "REMOTES_CANDIDATES", ())
    monkeypatch.delenv("KVM_SRIOV_CONFIG", raising=False)
    assert cli.main(reload_partitions(site)) == 1
    assert not site.reload_log.exists(), "ran a command another user's config named"
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"{config.HOST_CONFIG} is not read: " in err, err


@pytest.mark.skipif(not opensm_check.available(), reason="needs opensm, ibsim-utils, libumad2sim0")
def test_a_config_only_root_could_change_names_the_command_that_runs(site, monkeypatch):
    """The same files, root's own: read, and the command they name runs."""
    from kvm_sriov import cli
    monkeypatch.setattr(config, "HOST_CONFIG", str(site.tmp / "kvm-sriov.toml"))
    monkeypatch.setattr(cli, "REMOTES_CANDIDATES", ())
    monkeypatch.delenv("KVM_SRIOV_CONFIG", raising=False)
    assert cli.main(reload_partitions(site)) == 0
    assert site.reload_log.read_text() == "HUP\n"
    code, _, err = site("--config", str(site.tmp / "kvm-sriov.toml"), *reload_partitions(site))
    assert code == 0 and site.reload_log.read_text() == "HUP\nHUP\n", err


def test_partitions_says_what_it_left_out_on_stderr_only(site):
    """Networks 40000 and 40001 (IDs too large for the GUID: only MAC-only GUIDs
    of earlier VMs) lease the same MACs: those are in neither partition; network
    9 has no VLAN_ID: left out, said on stderr, its MACs still count."""
    xml = site.tmp / "vnets.xml"
    xml.write_text("""<VNET_POOL>
      <VNET><ID>40000</ID><NAME>a</NAME><BRIDGE>ib-sriov</BRIDGE><VLAN_ID>1</VLAN_ID>
        <AR_POOL><AR><AR_ID>0</AR_ID><MAC>02:00:0a:00:00:01</MAC><SIZE>8</SIZE></AR></AR_POOL></VNET>
      <VNET><ID>40001</ID><NAME>b</NAME><BRIDGE>ib-sriov</BRIDGE><VLAN_ID>2</VLAN_ID>
        <AR_POOL><AR><AR_ID>0</AR_ID><MAC>02:00:0a:00:00:05</MAC><SIZE>8</SIZE></AR></AR_POOL></VNET>
      <VNET><ID>3</ID><NAME>c</NAME><BRIDGE>ib-sriov</BRIDGE><VLAN_ID>3</VLAN_ID>
        <AR_POOL><AR><AR_ID>0</AR_ID><MAC>02:00:0a:00:01:01</MAC><SIZE>2</SIZE></AR></AR_POOL></VNET>
      <VNET><ID>9</ID><NAME>d</NAME><BRIDGE>ib-sriov</BRIDGE>
        <AR_POOL><AR><AR_ID>0</AR_ID><MAC>02:00:0a:00:01:02</MAC><SIZE>1</SIZE></AR></AR_POOL></VNET>
    </VNET_POOL>""")
    code, out, err = site("partitions", "--from-xml", str(xml))
    assert code == 0 and "network 9 ('d'): BRIDGE is ib-sriov but it has no VLAN_ID" in err
    assert out.startswith("# opensm partition configuration") and "one_vnet_40000=0x8001" in out
    assert "0x02000a0000000001" in out and "0x02000a0000000005" not in out   # 40000 alone / shared
    assert "0x02000a0008000101" in out and "0x02000a0000000101" in out     # network 3: both rules
    assert "0x02000a0008000102" in out and "0x02000a0000000102" not in out  # 9 can lease it too
    code, out, err = site("partitions", "--from-xml", str(xml), "--no-mac-only-guids")
    assert code == 0 and "0x02000a0008000101" in out and "0x02000a0000000101" not in out
    assert "one_vnet_40000=0x8001, ipoib, defmember=full : ;" in out          # no MAC-only: no members


ONEADMIN = 4242


@pytest.fixture
def world_readable_site():
    """A fake host, config and state directory another uid can reach (tmp_path is root's, 0700)."""
    import shutil
    import tempfile
    from tests.support.fake_sysfs import standard_host
    top = Path(tempfile.mkdtemp(prefix="kvm-sriov-cli."))
    top.chmod(0o755)
    standard_host(top / "root")
    state = top / "state"
    state.mkdir()
    os.chown(state, ONEADMIN, ONEADMIN)
    conf = top / "kvm-sriov.toml"
    conf.write_text(f'[sysfs]\nroot = "{top / "root"}"\n[pool]\npfs = ["mlx5_0"]\nstate_dir = "{state}"\n'
                    f'[libvirt]\nuri = "test:///default"\n')
    for p in [top, *top.rglob("*")]:
        if p != state:
            p.chmod(0o755 if p.is_dir() else 0o644)

    def run(*args):
        done = subprocess.run([sys.executable, str(CLI), *args], capture_output=True, text=True,
                              env=dict(os.environ, KVM_SRIOV_CONFIG=str(conf)), cwd="/", timeout=60)
        return done.returncode, done.stdout, done.stderr
    run.state = state
    run.conf = conf
    yield run
    shutil.rmtree(top)


def test_run_as_root_the_cli_works_as_the_state_directorys_owner(world_readable_site):
    """A root-owned pool.sqlite3 (0644) and lock (0640) once locked oneadmin's
    next action out with an internal PermissionError."""
    run = world_readable_site
    code, out, err = run("reconcile")
    assert code == 0, err
    assert "running as uid 4242" in err
    made = list(run.state.iterdir())
    assert made and all(p.lstat().st_uid == ONEADMIN for p in made), [(p.name, p.lstat().st_uid) for p in made]


def test_run_as_root_through_a_state_directory_link_the_administrator_made(world_readable_site):
    """state_dir may name a link root made (the pool allows it): root still
    becomes the owner of the folder it leads to, not the link's."""
    run = world_readable_site
    link = run.state.parent / "state-link"
    link.symlink_to(run.state)
    run.conf.write_text(run.conf.read_text().replace(f'state_dir = "{run.state}"', f'state_dir = "{link}"'))
    code, out, err = run("reconcile")
    assert code == 0, err
    assert "running as uid 4242" in err


def test_run_as_root_from_a_checkout_only_root_can_read(world_readable_site, tmp_path):
    """A CI clone lives in a 0700 mktemp directory: after the switch the
    library's own files are out of reach, so every module must be in first."""
    import shutil
    tree = tmp_path / "checkout"
    shutil.copytree(REPO / "bin", tree / "bin")
    shutil.copytree(REPO / "kvm_sriov", tree / "kvm_sriov", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "kvm_sriov_bootstrap.py", tree)
    tmp_path.chmod(0o700)
    done = subprocess.run([sys.executable, str(tree / "bin" / "kvm-sriov"), "reconcile"],
                          capture_output=True, text=True, cwd="/", timeout=60,
                          env=dict(os.environ, KVM_SRIOV_CONFIG=str(world_readable_site.conf),
                                   PYTHONDONTWRITEBYTECODE="1"))
    assert done.returncode == 0, done.stderr
    assert "running as uid 4242" in done.stderr


def test_root_owned_leftovers_in_the_state_directory_are_named(world_readable_site):
    run = world_readable_site
    (run.state / "pool.sqlite3.lock").write_text("")   # as an older version run as root left it
    code, out, err = run("status")
    assert code == 1 and f"{run.state / 'pool.sqlite3.lock'}" in err and "chown 4242:4242" in err


def test_config_from_remotes_another_user_could_have_planted_is_not_read(tmp_path, monkeypatch):
    """/var/tmp/one can be anybody's: a kvm-sriov.toml there could name
    commands (sm_reload_command, ip_command) that root would run."""
    from kvm_sriov import cli
    shared = tmp_path / "var-tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    planted = shared / "one" / config.REMOTES_CONFIG
    planted.parent.mkdir(parents=True)
    planted.write_text('[infiniband]\nsm_reload_command = ["/tmp/evil"]\n')
    for p in [shared / "one", *(shared / "one").rglob("*")]:
        os.lchown(p, 65534, 65534)
    monkeypatch.setattr(cli, "REMOTES_CANDIDATES", (shared / "one",))
    monkeypatch.delenv("KVM_SRIOV_CONFIG", raising=False)
    cfg = cli._load_config(cli.build_parser().parse_args(["partitions"]), None)
    assert "/tmp/evil" not in cfg.sm_reload_command
    os.lchown(planted, 0, 0)
    for p in [shared / "one", *(shared / "one").rglob("*")]:
        os.lchown(p, 0, 0)
    cfg = cli._load_config(cli.build_parser().parse_args(["partitions"]), None)
    assert cfg.sm_reload_command == ("/tmp/evil",)   # root's own tree is read
