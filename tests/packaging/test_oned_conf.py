"""`kvm-sriov setup-frontend` (kvm_sriov/frontend/oned_conf.py) on OpenNebula 7.4's
own oned.conf (from the source tarball): it registers the VM_MAD and the
placer, writes the defaults file, changes nothing a second time, keeps the
operator's edits, and undo gives oned.conf back byte for byte. Last, the
real oned of the 7.4 build starts on the result (the 7.4 build made first when missing)
and refuses a tenant's change of a network's VLAN_ID. Then the network hooks'
registration as Puppet and Ansible run it (`python3 -m
kvm_sriov.frontend.network_hook setup|check`, as oneadmin with its ONE_AUTH)
against a stand-in for oned's hook calls."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import pytest

from kvm_sriov.ib import pkey
from kvm_sriov.frontend import oned_conf
from kvm_sriov.oned import oned_defaults
from simhost import stock_kvm
from simhost.frontend import drivers_at_usual_priority
from tests.conftest import REPO
from tests.packaging.hook_oned import HookOned

TEMPLATES = REPO / "templates"


def _member(tar, suffix):
    m = next((m for m in tar.getmembers() if m.name.endswith(suffix)), None)
    assert m is not None, f"the OpenNebula tarball has no {suffix}"
    return tar.extractfile(m).read()


@pytest.fixture(scope="module")
def stock():
    try:
        source = stock_kvm.tarball()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    with tarfile.open(source) as tar:
        return _member(tar, "share/etc/oned.conf"), _member(tar, "src/vmm_mad/exec/x86_64/vmm_exec_kvm.conf")


@pytest.fixture
def etc(tmp_path, stock):
    """An /etc/one with the stock oned.conf (0640, as the packages have it) and vmm_exec_kvm.conf."""
    (tmp_path / "vmm_exec").mkdir()
    (tmp_path / "oned.conf").write_bytes(stock[0])
    os.chmod(tmp_path / "oned.conf", 0o640)
    (tmp_path / "vmm_exec" / "vmm_exec_kvm.conf").write_bytes(stock[1])
    return tmp_path


def run_setup(etc, **kw):
    lines = []
    changed = oned_conf.setup(etc / "oned.conf", TEMPLATES, out=lines.append, **kw)
    return changed, lines


def run_undo(etc):
    lines = []
    return oned_conf.undo(etc / "oned.conf", out=lines.append), lines


def vectors(text, name):
    return [a.value for a in oned_defaults.parse(text, "oned.conf") if a.name == name]


def test_setup_registers_the_driver_and_the_placer_and_only_adds(etc, stock):
    changed, lines = run_setup(etc)
    text = (etc / "oned.conf").read_text()
    assert changed
    mads = {v["NAME"]: v for v in vectors(text, "VM_MAD")}
    assert mads["kvm-sriov"]["ARGUMENTS"] == "-t 15 -r 0 kvm-sriov -p"
    assert mads["kvm-sriov"]["DEFAULT"] == "vmm_exec/vmm_exec_kvm-sriov.conf"
    assert set(mads) == {"kvm", "qemu", "lxc", "kvm-sriov"}
    assert vectors(text, "SCHED_MAD")[0]["ARGUMENTS"] == "-t 15 -p kvm-sriov -o one_drs"
    # NICs carry their network's KVM_SRIOV_PKEY: the placer holds VMs waiting for an AUTO key
    assert "KVM_SRIOV_PKEY" in vectors(text, "INHERIT_VNET_ATTR")
    old, new = stock[0].decode().splitlines(), text.splitlines()
    assert [line for line in old if line not in new] == ['      ARGUMENTS  = "-t 15 -p rank -o one_drs"']
    assert (etc / "oned.conf.kvm-sriov-backup").read_bytes() == stock[0]
    assert os.stat(etc / "oned.conf").st_mode & 0o777 == 0o640
    defaults = (etc / "vmm_exec" / "vmm_exec_kvm-sriov.conf").read_text()
    assert 'MODEL = "host-passthrough"' in defaults and "OVMF_UEFIS" in defaults
    assert any("restart oned" in line for line in lines)


def test_setup_restricts_vlan_id_and_keeps_the_stock_restrictions(etc, stock):
    """A network's VLAN_ID (its partition key) becomes a restricted attribute,
    added to the stock ones (oned reads every VNET_RESTRICTED_ATTR line)."""
    run_setup(etc)
    text = (etc / "oned.conf").read_text()
    stock_list = vectors(stock[0].decode(), "VNET_RESTRICTED_ATTR")
    assert "VN_MAD" in stock_list and "VLAN_ID" not in stock_list
    assert sorted(vectors(text, "VNET_RESTRICTED_ATTR")) == sorted(stock_list + ["VLAN_ID"])
    block = text[text.index(oned_conf.BEGIN):text.index(oned_conf.END)]
    assert 'VNET_RESTRICTED_ATTR = "VLAN_ID"' in block
    run_undo(etc)
    assert vectors((etc / "oned.conf").read_text(), "VNET_RESTRICTED_ATTR") == stock_list


def test_a_block_written_before_the_restriction_gains_it(etc):
    """An oned.conf set up by an earlier kvm-sriov: check says setup would
    change it, setup adds the line to the block, undo still gives the stock file."""
    conf = etc / "oned.conf"
    stock_text = conf.read_text()
    run_setup(etc)
    conf.write_text(conf.read_text().replace('VNET_RESTRICTED_ATTR = "VLAN_ID"\n', ""))
    assert oned_conf.setup(conf, TEMPLATES, out=lambda _l: None, dry_run=True)
    changed, _lines = run_setup(etc)
    assert changed and conf.read_text().count('VNET_RESTRICTED_ATTR = "VLAN_ID"') == 1
    assert not run_setup(etc)[0]
    run_undo(etc)
    assert conf.read_text() == stock_text


def test_the_block_sits_among_the_vm_mads(etc):
    run_setup(etc)
    text = (etc / "oned.conf").read_text()
    assert text.index('NAME           = "lxc"') < text.index(oned_conf.BEGIN) < text.index("SCHED_MAD = [")


def test_a_second_setup_changes_nothing(etc):
    run_setup(etc)
    before = {p.name: p.read_bytes() for p in etc.rglob("*") if p.is_file()}
    changed, lines = run_setup(etc)
    assert not changed and "nothing changed" in lines[-1]
    assert {p.name: p.read_bytes() for p in etc.rglob("*") if p.is_file()} == before


def test_undo_gives_oned_conf_back_byte_for_byte(etc, stock):
    run_setup(etc)
    changed, lines = run_undo(etc)
    assert changed and "byte for byte" in lines[0]
    assert (etc / "oned.conf").read_bytes() == stock[0]
    assert not (etc / "oned.conf.kvm-sriov-backup").exists()
    assert not (etc / "vmm_exec" / "vmm_exec_kvm-sriov.conf").exists()
    assert (etc / "vmm_exec" / "vmm_exec_kvm.conf").read_bytes() == stock[1]
    assert run_undo(etc)[0] is False  # nothing left to undo


def test_operator_edits_before_and_after_setup_are_kept(etc):
    conf = etc / "oned.conf"
    before = conf.read_text().replace("#MANAGER_TIMER = 15", "MANAGER_TIMER = 30  # site: slower")
    conf.write_text(before)
    run_setup(etc)
    edited = conf.read_text().replace("MONITORING_INTERVAL_MARKET    = 600",
                                      "#  site note\nMONITORING_INTERVAL_MARKET    = 900")
    assert edited != conf.read_text()
    conf.write_text(edited)
    assert not run_setup(etc)[0]  # our block is still as it should be
    changed, lines = run_undo(etc)
    text = conf.read_text()
    assert "MANAGER_TIMER = 30  # site: slower" in text and "#  site note\nMONITORING_INTERVAL_MARKET    = 900" in text
    assert text == before.replace("MONITORING_INTERVAL_MARKET    = 600",
                                  "#  site note\nMONITORING_INTERVAL_MARKET    = 900")
    assert oned_conf.BEGIN not in text and '"-t 15 -p rank -o one_drs"' in text
    assert "edited since setup" in lines[0] and (etc / "oned.conf.kvm-sriov-backup").exists()


def test_a_hand_made_kvm_sriov_vm_mad_is_refused_unchanged(etc):
    conf = etc / "oned.conf"
    conf.write_text(conf.read_text() + '\nVM_MAD = [ NAME = "kvm-sriov", EXECUTABLE = "one_vmm_exec" ]\n')
    before = conf.read_bytes()
    with pytest.raises(oned_conf.Refused, match="already has a VM_MAD"):
        run_setup(etc)
    assert conf.read_bytes() == before and not (etc / "oned.conf.kvm-sriov-backup").exists()


def test_the_old_puppet_block_becomes_the_one_block(etc):
    """What the Puppet module's former helper appended (its own markers) is
    replaced: the result is what setup makes of the stock file."""
    conf = etc / "oned.conf"
    stock = conf.read_text()
    conf.write_text(stock + f"\n{oned_conf.PUPPET_BEGIN}\nVM_MAD = [ NAME = \"kvm-sriov\" ]\n{oned_conf.PUPPET_END}\n")
    run_setup(etc)
    text = conf.read_text()
    assert oned_conf.PUPPET_BEGIN not in text and text.count(oned_conf.BEGIN) == 1
    conf.write_text(stock)
    (etc / "oned.conf.kvm-sriov-backup").unlink()
    run_setup(etc)
    assert conf.read_text() == text


def test_no_placer_after_setup_puts_the_placer_back(etc, stock):
    """Puppet's manage_sched_mad => false after true: the same file as a
    registration that never selected the placer."""
    run_setup(etc, placer=False)
    without = (etc / "oned.conf").read_bytes()
    assert b"-p rank -o one_drs" in without and oned_conf.PLACER_NOTE.encode() not in without
    run_setup(etc)
    assert b"-p kvm-sriov -o one_drs" in (etc / "oned.conf").read_bytes()
    assert run_setup(etc, placer=False)[0]
    assert (etc / "oned.conf").read_bytes() == without
    assert not run_setup(etc, placer=False)[0]


def test_check_says_whether_setup_would_change_anything(etc):
    def check(*extra):
        return subprocess.run([sys.executable, "-m", "kvm_sriov.frontend.oned_conf", "check", "--oned-conf", etc / "oned.conf",
                               "--templates", TEMPLATES, *extra], cwd=REPO, capture_output=True, text=True).returncode
    before = (etc / "oned.conf").read_bytes()
    assert check() == 3 and (etc / "oned.conf").read_bytes() == before
    assert not (etc / "vmm_exec" / "vmm_exec_kvm-sriov.conf").exists()
    run_setup(etc)
    assert check() == 0
    assert check("--no-placer") == 3


def test_a_given_vm_mad_is_registered_instead_of_the_template(etc, tmp_path):
    mad = tmp_path / "vm_mad.conf"
    mad.write_text((TEMPLATES / "oned" / "oned.conf.vm_mad").read_text().replace("-t 15 -r 0", "-t 4 -r 2"))
    lines = []
    oned_conf.setup(etc / "oned.conf", TEMPLATES, out=lines.append, vm_mad_file=mad)
    mads = {v["NAME"]: v for v in vectors((etc / "oned.conf").read_text(), "VM_MAD")}
    assert mads["kvm-sriov"]["ARGUMENTS"] == "-t 4 -r 2 kvm-sriov -p"
    mad.write_text("LOG = [ SYSTEM = \"file\" ]\n")
    with pytest.raises(oned_conf.Refused, match="one VM_MAD vector"):
        oned_conf.setup(etc / "oned.conf", TEMPLATES, out=lines.append, vm_mad_file=mad)


def test_without_sched_mad_nothing_changes_unless_no_placer(etc):
    conf = etc / "oned.conf"
    text = re.sub(r"(?ms)^SCHED_MAD = \[.*?^\]\n", "", conf.read_text())
    conf.write_text(text)
    with pytest.raises(oned_conf.Refused, match="no SCHED_MAD"):
        run_setup(etc)
    assert conf.read_text() == text
    assert run_setup(etc, placer=False)[0]
    assert run_undo(etc)[0] and conf.read_text() == text


def test_a_placer_word_is_added_and_taken_back(etc):
    conf = etc / "oned.conf"
    text = conf.read_text().replace('"-t 15 -p rank -o one_drs"', '"-t 15 -o one_drs"')
    conf.write_text(text)
    run_setup(etc)
    assert vectors(conf.read_text(), "SCHED_MAD")[0]["ARGUMENTS"] == "-p kvm-sriov -t 15 -o one_drs"
    run_undo(etc)
    assert conf.read_text() == text


@pytest.fixture(scope="module")
def one_sched_placer():
    """The placer OpenNebula 7.4's one_sched would use with the given SCHED_MAD
    ARGUMENTS: its own option table (src/schedm_mad/one_sched.rb) run by Ruby's
    GetoptLong on the words its shell wrapper splits them into ($*)."""
    with tarfile.open(stock_kvm.tarball()) as tar:
        source = _member(tar, "src/schedm_mad/one_sched.rb").decode()
    table = re.search(r"(?ms)^opts = GetoptLong\.new\(.*?^\)$", source)
    assert table, "one_sched.rb has no GetoptLong table"
    script = ("require 'getoptlong'\nrequire 'json'\nARGV.replace(JSON.parse(ENV['WORDS']))\n" + table.group() +
              "\nopts.quiet = true\nplacer = 'rank'\nbegin\n  opts.each { |o, a| placer = a if o == '--placer' }\n"
              "rescue GetoptLong::Error => e\n  puts \"error #{e.class}\"\n  exit\nend\nputs placer\n")

    def placer(arguments):
        words = re.split(r"[ \t\n]+", arguments.strip())
        r = subprocess.run(["ruby", "-e", script], env=dict(os.environ, WORDS=json.dumps(words)),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()
    return placer


@pytest.mark.parametrize("arguments", [
    "-t 15 -p rank -o one_drs", "-t 15 --placer rank -o one_drs", "-t 15 --placer=rank -o one_drs",
    "-t 15 -prank -o one_drs", "--pl rank -t 15", "--p=rank", "-p rank -o one_drs -p other", "-t -p rank",
    "-t15 --placer=rank --placer other -o one_drs", "-tp rank -o one_drs", "-t 15 -o one_drs", "-o -p -p rank",
    "-t 15 -- -p rank", "rank -p\trank2"])
def test_the_placer_is_the_one_one_sched_reads(etc, arguments, one_sched_placer):
    """Every way one_sched's GetoptLong takes a placer (long, short, attached,
    '=', shortened, repeated: the last wins): setup selects kvm-sriov for
    one_sched itself, undo gives the file back byte for byte."""
    conf = etc / "oned.conf"
    text = conf.read_text().replace('"-t 15 -p rank -o one_drs"', f'"{arguments}"')
    conf.write_text(text)
    run_setup(etc)
    assert one_sched_placer(vectors(conf.read_text(), "SCHED_MAD")[0]["ARGUMENTS"]) == "kvm-sriov"
    assert not run_setup(etc)[0]
    run_undo(etc)
    assert conf.read_text() == text


@pytest.mark.parametrize("arguments", ["-t 15 -p", "-x rank", "--pla=rank --p", "--placer=", "--o=a --threads=1 -q"])
def test_arguments_one_sched_refuses_are_refused_unchanged(etc, arguments, one_sched_placer):
    conf = etc / "oned.conf"
    conf.write_text(conf.read_text().replace('"-t 15 -p rank -o one_drs"', f'"{arguments}"'))
    before = conf.read_bytes()
    assert one_sched_placer(arguments).startswith("error") or arguments == "--placer="
    with pytest.raises(oned_conf.Refused, match="do not work with one_sched"):
        run_setup(etc)
    assert conf.read_bytes() == before and not (etc / "oned.conf.kvm-sriov-backup").exists()


def test_undo_keeps_an_operators_lines_inside_the_block_and_the_backup(etc, stock):
    """Lines an operator wrote inside the block are not setup's to take: undo
    leaves them where the block was, keeps the backup and does not claim a
    byte-for-byte result; a second setup moves them below its block."""
    conf = etc / "oned.conf"
    run_setup(etc)
    mine = '# site: the ib hosts\nVM_MAD = [ NAME = "site", EXECUTABLE = "one_vmm_exec", ARGUMENTS = "site" ]\n'
    text = conf.read_text()
    conf.write_text(text.replace(oned_conf.INHERIT, mine + oned_conf.INHERIT))
    changed, lines = run_undo(etc)
    after = conf.read_text()
    assert changed and mine in after and oned_conf.BEGIN not in after
    assert after.replace(mine, "", 1) == stock[0].decode()  # in the block's place, the rest as before setup
    assert {v["NAME"] for v in vectors(after, "VM_MAD")} == {"kvm", "qemu", "lxc", "site"}
    assert (etc / "oned.conf.kvm-sriov-backup").read_bytes() == stock[0]
    assert not [line for line in lines if "byte for byte" in line]
    assert any("inside the kvm-sriov block stay" in line for line in lines)
    conf.write_text(text.replace(oned_conf.RESTRICT, oned_conf.RESTRICT + mine))
    changed, _lines = run_setup(etc)
    assert changed and oned_conf.END + "\n\n" + mine in conf.read_text()
    assert not run_setup(etc)[0]


@pytest.mark.parametrize("edit, why", [
    (lambda t: t + '\nVM_MAD = [ NAME = "kvm-sriov", EXECUTABLE = "one_vmm_exec" ]\n', 'VM_MAD "kvm-sriov"'),
    (lambda t: t + '\nVM_MAD = [ NAME = "ib", ARGUMENTS = "-t 4 kvm-sriov" ]\n', 'VM_MAD "ib"'),
    (lambda t: t.replace('"-t 15 -p rank -o one_drs"', '"-t 15 --placer=kvm-sriov"'), "SCHED_MAD placer"),
])
def test_in_use_reads_oned_conf_as_oned_does(etc, edit, why):
    """The front-end package's removal guard: a hand-written VM_MAD, one that
    runs the driver under another name, the placer alone, an indented marker."""
    conf = etc / "oned.conf"

    def in_use():
        r = subprocess.run([sys.executable, "-m", "kvm_sriov.frontend.oned_conf", "in-use", "--oned-conf", conf],
                           cwd=REPO, capture_output=True, text=True)
        return r.returncode, r.stdout + r.stderr
    assert in_use() == (0, "")
    stock_text = conf.read_text()
    conf.write_text(edit(stock_text))
    rc, out = in_use()
    assert rc == 3 and why in out, out
    conf.write_text(stock_text)
    run_setup(etc)
    conf.write_text(conf.read_text().replace(oned_conf.BEGIN, "  " + oned_conf.BEGIN))
    rc, out = in_use()
    assert rc == 3 and 'VM_MAD "kvm-sriov"' in out, out
    conf.unlink()
    assert in_use()[0] == 0  # no oned.conf: nothing uses the driver


def test_a_defaults_file_made_before_is_put_back(etc):
    old = etc / "vmm_exec" / "vmm_exec_kvm-sriov.conf"
    old.write_text('CPU_MODEL = [ MODEL = "site" ]\n')
    run_setup(etc)
    assert "host-passthrough" in old.read_text()
    run_undo(etc)
    assert old.read_text() == 'CPU_MODEL = [ MODEL = "site" ]\n'


def test_a_symlinked_oned_conf_is_refused(etc, tmp_path):
    real = etc / "real.conf"
    os.replace(etc / "oned.conf", real)
    os.symlink(real, etc / "oned.conf")
    with pytest.raises(oned_conf.Refused, match="symlink"):
        run_setup(etc)


@pytest.mark.parametrize("args, message", [
    (["setup", "--oned-conf", "/nonexistent/oned.conf"], "no such file"),
    (["setup", "--templates", "/nonexistent"], "templates/oned not found"),
])
def test_the_command_says_one_line_and_exits_1(args, message):
    r = subprocess.run([sys.executable, "-m", "kvm_sriov.frontend.oned_conf", *args], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 1 and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def _free_port_block():
    from simhost.frontend import _free_port_block as block
    return block(6, start=3100)


@pytest.fixture(scope="module")
def real_oned(tmp_path_factory):
    """The 7.4 build's oned on a copy of its etc/ after setup: (endpoint, oneadmin's session, log)."""
    from simhost.frontend import locate_install   # builds it once (build.sh), as the rung-4 suites do
    try:
        prefix = locate_install()
    except Exception as e:   # one line, a failed test: never a silent skip
        pytest.fail(f"no OpenNebula 7.4 to start oned on: {e}", pytrace=False)
    loc = tmp_path_factory.mktemp("real-oned") / "one"
    loc.mkdir()
    for part in ("bin", "lib", "share", "include", "sbin"):
        if (prefix / part).exists():
            os.symlink(prefix / part, loc / part)
    shutil.copytree(prefix / "etc", loc / "etc", symlinks=True)
    shutil.copytree(prefix / "var", loc / "var", symlinks=True,
                    ignore=shutil.ignore_patterns("datastores", "vms", "*.db", "*.log", ".one"))
    drivers_at_usual_priority(loc / "etc")
    port = _free_port_block()
    conf = loc / "etc" / "oned.conf"
    text = conf.read_text()
    for key, value in (("PORT", port), ("GRPC_PORT", port + 1)):
        text, n = re.subn(rf"(?m)^{key}\s*=.*$", f"{key} = {value}", text, count=1)
        assert n == 1, key
    text, n = re.subn(r"-p 2101 -l 2102", f"-p {port + 2} -l {port + 3}", text)
    assert n == 1
    conf.write_text(text)
    mon = loc / "etc" / "monitord.conf"
    mon.write_text(re.sub(r"(\n\s*PORT\s*=\s*)4124", rf"\g<1>{port + 4}", mon.read_text()))
    (loc / "var" / ".one").mkdir()
    (loc / "var" / ".one" / "one_auth").write_text("oneadmin:password\n")
    placer = loc / "var" / "remotes" / "scheduler" / "kvm-sriov"
    placer.mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO / "sched" / "kvm-sriov" / "place", placer / "place")
    assert oned_conf.setup(conf, TEMPLATES, out=lambda _line: None)

    env = dict(os.environ, ONE_LOCATION=str(loc), ONE_AUTH=str(loc / "var" / ".one" / "one_auth"),
               PATH=f"{loc / 'bin'}:{os.environ['PATH']}", RUBYLIB=str(loc / "lib" / "ruby"))
    endpoint = f"http://127.0.0.1:{port}/RPC2"
    oned = subprocess.Popen([str(loc / "bin" / "oned"), "-f"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log = loc / "var" / "oned.log"
    try:
        deadline = time.time() + 90
        listed = None
        while time.time() < deadline and oned.poll() is None:
            r = subprocess.run([str(loc / "bin" / "onehost"), "list", "--endpoint", endpoint],
                               env=env, capture_output=True, text=True)
            if r.returncode == 0:
                listed = r
                break
            time.sleep(1)
        text = log.read_text(errors="replace") if log.exists() else ""
        assert listed is not None, f"oned did not answer (exit {oned.poll()}); oned.log:\n{text[-3000:]}"
        yield endpoint, "oneadmin:password", log
    finally:
        if oned.poll() is None:
            os.killpg(oned.pid, signal.SIGTERM)
            try:
                oned.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(oned.pid, signal.SIGKILL)
                oned.wait()


def test_the_real_oned_starts_on_the_result(real_oned):
    log = real_oned[2]
    text = log.read_text(errors="replace")
    for _ in range(30):  # the drivers load right after the API opens
        if "kvm-sriov" in text and "loaded" in text.split("kvm-sriov", 1)[1]:
            break
        time.sleep(1)
        text = log.read_text(errors="replace")
    assert re.search(r"Loading driver: kvm-sriov", text), text[-3000:]
    assert not re.search(r"\[E\].*kvm-sriov", text), text[-3000:]


def test_a_tenant_cannot_change_or_drop_a_networks_key_and_oneadmin_can(real_oned):
    """VNET_RESTRICTED_ATTR VLAN_ID on the real oned: the owner of a network (a
    tenant in the users group) can edit it but not its VLAN_ID (the IB
    partition key), neither by a new value, nor an empty one, nor by a
    replace that leaves it out; oneadmin's merge (what the network hook does)
    still writes it."""
    import xmlrpc.client
    endpoint, admin, _log = real_oned
    rpc = xmlrpc.client.ServerProxy(endpoint)

    def ok(reply):
        assert reply[0], reply[1]
        return reply[1]

    uid = ok(rpc.one.user.allocate(admin, "tenant", "tenantpw", "core", []))
    net = ok(rpc.one.vn.allocate(admin, 'NAME = "ib-tenant"\nVN_MAD = "dummy"\nBRIDGE = "ib-sriov0"\n'
                                        'VLAN_ID = "0x8001"\nAR = [ TYPE = "ETHER", SIZE = "2" ]\n', -1))
    ok(rpc.one.vn.chown(admin, net, uid, 1))
    tenant = "tenant:tenantpw"

    def vlan():
        return re.search(r"<VLAN_ID><!\[CDATA\[([^\]]*)\]\]>", ok(rpc.one.vn.info(admin, net, False))).group(1)

    assert vlan() == "0x8001"
    ok(rpc.one.vn.update(tenant, net, 'DESCRIPTION = "mine"', 1))   # the owner may edit the rest
    for template, kind in (('VLAN_ID = "0x8002"', 1), ('VLAN_ID = ""', 1), ('VLAN_ID = "0x8002"', 0)):
        reply = rpc.one.vn.update(tenant, net, template, kind)
        assert not reply[0], f"{template} (update type {kind}) was accepted"
        assert vlan() == "0x8001"
    ok(rpc.one.vn.update(tenant, net, 'DESCRIPTION = "replaced"', 0))  # VLAN_ID left out: kept
    assert vlan() == "0x8001"
    ok(rpc.one.vn.update(admin, net, 'VLAN_ID = "0x8003"', 1))
    assert vlan() == "0x8003"


def test_the_cli_sets_up_and_undoes(etc, stock, tmp_path, capsys):
    """`kvm-sriov setup-frontend` and `--undo`, as the package and docs tell operators."""
    from kvm_sriov import cli
    args = ["setup-frontend", "--oned-conf", str(etc / "oned.conf"), "--templates", str(TEMPLATES),
            "--remotes", str(tmp_path / "no-remotes")]
    assert cli.main(args) == 0
    assert oned_conf.BEGIN in (etc / "oned.conf").read_text()
    assert (etc / "vmm_exec" / "vmm_exec_kvm-sriov.conf").is_file()
    assert cli.main(args) == 0   # again: nothing to change
    assert cli.main(args + ["--undo"]) == 0
    assert (etc / "oned.conf").read_bytes() == stock[0]


# --- the network hooks' registration (Puppet, Ansible) ------------------------------

HOOK_COMMAND = "/usr/lib/kvm-sriov/bin/kvm-sriov network-hook"


def hooks_module(action, oned_endpoint, one_auth, *extra, command=HOOK_COMMAND):
    env = dict(os.environ, ONE_AUTH=str(one_auth), PYTHONPATH=str(REPO))
    env.pop("ONE_XMLRPC", None)
    return subprocess.run([sys.executable, "-m", "kvm_sriov.frontend.network_hook", action, "--command", command,
                           "--endpoint", oned_endpoint, *extra], cwd="/", env=env, capture_output=True,
                          text=True, timeout=60)


def test_check_then_setup_then_nothing_to_do(tmp_path):
    auth = tmp_path / "one_auth"
    auth.write_text("oneadmin:secret\n")
    with HookOned() as oned:
        r = hooks_module("check", oned.endpoint, auth)
        assert r.returncode == 3 and not oned.writes, r.stderr
        assert r.stdout.count("would create hook kvm-sriov-network-") == len(pkey.NETWORK_CALLS) + 2
        r = hooks_module("setup", oned.endpoint, auth)
        assert r.returncode == 0, r.stderr
        assert len(oned.hooks) == len(pkey.NETWORK_CALLS) + 2
        assert {h["COMMAND"] for h in oned.hooks.values()} == {HOOK_COMMAND}
        assert hooks_module("check", oned.endpoint, auth).returncode == 0
        writes = list(oned.writes)
        r = hooks_module("setup", oned.endpoint, auth)
        assert r.returncode == 0 and "nothing changed" in r.stdout and oned.writes == writes


def test_a_hook_with_another_command_is_updated(tmp_path):
    auth = tmp_path / "one_auth"
    auth.write_text("oneadmin:secret\n")
    with HookOned() as oned:
        assert hooks_module("setup", oned.endpoint, auth, command="/opt/old/bin/kvm-sriov network-hook").returncode == 0
        r = hooks_module("check", oned.endpoint, auth)
        assert r.returncode == 3 and "would update hook" in r.stdout
        assert hooks_module("setup", oned.endpoint, auth).returncode == 0
        assert {h["COMMAND"] for h in oned.hooks.values()} == {HOOK_COMMAND}
        assert len(oned.hooks) == len(pkey.NETWORK_CALLS) + 2


def test_a_wrong_session_or_no_oned_is_one_line_and_exit_1(tmp_path):
    auth = tmp_path / "one_auth"
    auth.write_text("oneadmin:wrong\n")
    with HookOned() as oned:
        for action in ("check", "setup"):
            r = hooks_module(action, oned.endpoint, auth)
            assert r.returncode == 1 and "refused" in r.stderr and not oned.writes
            assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    r = hooks_module("check", "http://127.0.0.1:9/RPC2", auth)
    assert r.returncode == 1 and "cannot reach OpenNebula" in r.stderr and "Traceback" not in r.stderr
    r = hooks_module("setup", "http://127.0.0.1:9/RPC2", tmp_path / "missing")
    assert r.returncode == 1 and "no OpenNebula credentials" in r.stderr and "Traceback" not in r.stderr
