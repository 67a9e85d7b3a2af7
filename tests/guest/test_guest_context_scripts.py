"""The one-context hooks, run for real (bash + real ip in a netns + fake sysfs)."""
import os
import shutil
import subprocess

import pytest

from guest_helpers import CTX, context_from_fixture, mac_to_port_guid

LOC = CTX / "loc-16-kvm-sriov-ib"
NET = CTX / "net-16-kvm-sriov-ib"
SM = CTX / "net-90-kvm-sriov-sm"


def bash_fn(expr: str) -> str:
    """Call a function of the library directly."""
    r = subprocess.run(["bash", "-c", f'. "{CTX}/kvm-sriov-ib.d/functions.sh"; {expr}'],
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "IB_SYSLOG": "NO"})
    assert r.returncode == 0, r.stderr
    return r.stdout


# ------------------------------------------------------------------ pure rules

@pytest.mark.parametrize("mac,guid", [
    ("02:00:0a:64:00:2a", "02000a000064002a"),
    ("02:00:0A:64:00:2B", "02000a000064002b"),
    ("00:02:c9:a1:b2:c3", "0002c90000a1b2c3"),
])
def test_port_guid_from_mac_follows_conventions(mac, guid):
    assert mac_to_port_guid(mac) == guid
    assert bash_fn(f"ib_mac_to_port_guid {mac}") == guid


def test_gid_and_ipoib_hwaddr_carry_the_guid():
    assert bash_fn("ib_gid_to_guid fe80:0000:0000:0000:0200:0a00:0064:002a") == "02000a000064002a"
    hw = "00:00:00:48:fe:80:00:00:00:00:00:00:02:00:0a:00:00:64:00:2a"
    assert bash_fn(f"ib_hwaddr_to_guid {hw}") == "02000a000064002a"


@pytest.mark.parametrize("mask,prefix", [("255.255.0.0", "16"), ("255.255.255.0", "24"),
                                         ("255.255.240.0", "20"), ("255.255.255.255", "32"), ("22", "22")])
def test_mask_to_prefix(mask, prefix):
    assert bash_fn(f"ib_mask_to_prefix {mask}") == prefix


@pytest.mark.parametrize("vlan,base", [("0x8001", "1"), ("0x0001", "1"), ("1", "1"),
                                       ("0x7fff", "32767"), ("0xFFFF", "32767"), ("32770", "2")])
def test_pkey_from_vlan_id(vlan, base):
    assert bash_fn(f"ib_pkey_base {vlan}") == base


# ------------------------------------------------------------------ real runs

def fixture_guest(guest, **port):
    """The VM of the real OpenNebula fixture: ETH0 Ethernet, ETH1 on ib-sriov."""
    ctx = context_from_fixture()
    guest.env.update({k: v for k, v in ctx.items() if k.startswith("ETH")})
    guest.ethernet("eth0", ctx["ETH0_MAC"])
    guest.module("mlx5_core", "mlx5_ib", "ib_ipoib", "ib_umad", "rdma_ucm")
    guest.pci()
    port.setdefault("pkey", "0x8001")
    guest.ib_port(mac=ctx["ETH1_MAC"], **port)
    return ctx


def test_fixture_context_brings_up_ipoib(guest):
    ctx = fixture_guest(guest)
    r = guest.run(LOC)
    assert r.returncode == 0, r.stdout + r.stderr
    # ETH1_IP/MASK/MTU of the real context applied to the real link
    assert guest.addrs("ib0") == [f"{ctx['ETH1_IP']}/16"]
    assert guest.link("ib0")["mtu"] == int(ctx["ETH1_MTU"])
    assert "UP" in guest.link("ib0")["flags"]
    assert guest.read("class/net/ib0/mode") == "datagram"
    # the Ethernet NIC is left to one-context
    assert guest.addrs("eth0") == []
    assert "ETH1 (02:00:0a:64:00:2a) is IB port mlx5_0/1 GUID 0x02000a000064002a netdev ib0" in r.stdout
    status = (guest.state / "status").read_text()
    assert "port mlx5_0/1 guid 0x02000a000064002a state ACTIVE" in status
    assert "lid 0x5" in status and "rate 100 Gb/sec (4X EDR)" in status and "ib0(ETH1)" in status
    assert "WARN" not in r.stdout, r.stdout


def test_rerun_is_idempotent(guest):
    fixture_guest(guest)
    first = guest.run(LOC)
    assert first.returncode == 0, first.stdout
    before = (guest.link("ib0"), guest.read("class/net/ib0/mode"), (guest.state / "status").read_text())
    second = guest.run(LOC)
    assert second.returncode == 0, second.stdout
    after = (guest.link("ib0"), guest.read("class/net/ib0/mode"), (guest.state / "status").read_text())
    assert before == after
    assert "mtu 4092 (unchanged)" in second.stdout
    assert "address 10.100.0.42/16 (unchanged)" in second.stdout
    assert "mode datagram (unchanged)" in second.stdout
    # the network stage re-applies the same configuration: still no change
    third = guest.run(NET, "network", env={"IB_INSTALL_STACK": "NO"})
    assert third.returncode == 0, third.stdout
    assert guest.link("ib0") == after[0]


def test_connected_mode_and_default_mtu(guest):
    fixture_guest(guest)
    r = guest.run(LOC, env={"ETH1_IPOIB_MODE": "connected", "ETH1_MTU": ""})
    assert r.returncode == 0, r.stdout
    assert guest.read("class/net/ib0/mode") == "connected"
    assert guest.link("ib0")["mtu"] == 65520
    # and back to datagram with an explicit MTU
    r = guest.run(LOC, env={"ETH1_IPOIB_MODE": "datagram", "ETH1_MTU": "2044"})
    assert r.returncode == 0, r.stdout
    assert guest.read("class/net/ib0/mode") == "datagram"
    assert guest.link("ib0")["mtu"] == 2044


def test_datagram_mtu_is_capped(guest):
    fixture_guest(guest)
    r = guest.run(LOC, env={"ETH1_MTU": "9000"})
    assert r.returncode == 0
    assert guest.link("ib0")["mtu"] == 4092
    assert "above the datagram-mode maximum" in r.stdout


def test_new_context_address_replaces_the_old_one(guest):
    fixture_guest(guest)
    assert guest.run(LOC).returncode == 0
    r = guest.run(LOC, env={"ETH1_IP": "10.100.7.9", "ETH1_MASK": "255.255.255.0",
                            "ETH1_IP6": "fd00:100::2a", "ETH1_IP6_PREFIX_LENGTH": "64"})
    assert r.returncode == 0, r.stdout
    assert guest.addrs("ib0") == ["10.100.7.9/24"]
    assert guest.addrs("ib0", "inet6") == ["fd00:100::2a/64"]
    assert "removed stale address 10.100.0.42/16" in r.stdout


@pytest.mark.parametrize("env, error", [
    ({"ETH1_IP6": "fd00::1%x\nkvm-sriov-ib: INFO: forged"}, "IP6 'fd00::1%x?kvm-sriov-ib:?INFO:?forged' is not"),
    ({"ETH1_IP6": "fd00::1%ib0"}, "IP6 'fd00::1%ib0' is not an IPv6 address"),
    ({"ETH1_IP6": "fd00::1", "ETH1_IP6_PREFIX_LENGTH": "64\nkvm-sriov-ib: INFO: forged"}, "IP6_PREFIX_LENGTH"),
    ({"ETH1_IP6": "fd00::1", "ETH1_IP6_PREFIX_LENGTH": "129"}, "IP6_PREFIX_LENGTH '129' is not 0..128"),
    ({"ETH1_IP": "10.100.0.42\nkvm-sriov-ib: INFO: forged"}, "IP '10.100.0.42?kvm-sriov-ib:?INFO:?forged' is not"),
], ids=["ip6 scope and newline", "ip6 scope", "ip6 prefix newline", "ip6 prefix 129", "ip newline"])
def test_a_context_address_that_is_not_one_address_is_one_error_line(guest, env, error):
    fixture_guest(guest)
    r = guest.run(LOC, env=env)
    assert r.returncode == 1 and error in r.stdout, r.stdout
    assert not any(line.startswith("kvm-sriov-ib: INFO: forged") for line in r.stdout.splitlines())
    assert guest.addrs("ib0", "inet6") == []
    if "ETH1_IP" not in env:   # the rest of the NIC is still set up
        assert guest.addrs("ib0") == ["10.100.0.42/16"]


def test_pkey_child_interface_used_when_parent_is_default_partition(guest):
    fixture_guest(guest, pkey="0xffff")
    child = guest.ib_child("ib0", "0x8001")
    r = guest.run(LOC)
    assert r.returncode == 0, r.stdout
    assert child == "ib0.8001"
    assert guest.addrs("ib0.8001") == ["10.100.0.42/16"]
    assert guest.addrs("ib0") == []
    assert "UP" in guest.link("ib0")["flags"]  # parent up for the child
    assert guest.read("class/net/ib0/create_child") == ""  # already there: not created again
    assert "ib0.8001(ETH1)" in (guest.state / "status").read_text()


def test_pkey_child_is_requested_from_the_kernel(guest):
    fixture_guest(guest, pkey="0xffff")
    r = guest.run(LOC, env={"ETH1_VLAN_ID": "0x0001"})
    # the fake kernel never creates ib0.8001: a clear error, non-zero exit
    assert r.returncode == 1
    assert guest.read("class/net/ib0/create_child") == "0x8001"
    assert "PKey child ib0.8001 did not appear within 1s" in r.stdout


def test_ports_matched_by_guid_not_by_order(guest):
    guest.module("mlx5_core", "mlx5_ib", "ib_ipoib")
    # ETH1 is the second device, ETH2 the first one
    guest.ib_port(dev="mlx5_0", mac="02:00:0a:65:00:07", netdev="ib0")
    guest.ib_port(dev="mlx5_1", mac="02:00:0a:64:00:07", netdev="ib1")
    guest.env.update({"ETH1_MAC": "02:00:0a:64:00:07", "ETH1_IP": "10.100.0.7", "ETH1_MASK": "255.255.0.0",
                      "ETH2_MAC": "02:00:0a:65:00:07", "ETH2_IP": "10.101.0.7", "ETH2_MASK": "255.255.0.0",
                      "ETH2_IPOIB_MODE": "connected"})
    r = guest.run(LOC)
    assert r.returncode == 0, r.stdout
    assert guest.addrs("ib1") == ["10.100.0.7/16"]
    assert guest.addrs("ib0") == ["10.101.0.7/16"]
    assert guest.read("class/net/ib0/mode") == "connected"
    assert guest.read("class/net/ib1/mode") == "datagram"


def test_port_whose_guid_carries_the_network_is_found(guest):
    """The driver puts the VM's OpenNebula network in the GUID's two middle
    bytes (network 5: 00:0c); the guest knows only the MAC, and that is enough."""
    ctx = fixture_guest(guest, guid="02000a000c64002a")
    r = guest.run(LOC)
    assert r.returncode == 0, r.stdout + r.stderr
    assert guest.addrs("ib0") == [f"{ctx['ETH1_IP']}/16"]
    assert "ETH1 (02:00:0a:64:00:2a) is IB port mlx5_0/1 GUID 0x02000a000c64002a netdev ib0" in r.stdout
    assert "matches no context NIC" not in r.stdout and "WARN" not in r.stdout, r.stdout


def test_netdev_found_through_device_when_hwaddr_differs(guest):
    guest.module("mlx5_core")
    guid = guest.ib_port(mac="02:00:0a:64:00:2a")
    # an older kernel that reports another address: fall back to device/net + dev_port
    (guest.sys / "class/net/ib0/address").write_text("00:00:00:48:" + ":".join(["00"] * 16) + "\n")
    guest.env.update({"ETH1_MAC": "02:00:0a:64:00:2a", "ETH1_IP": "10.100.0.42", "ETH1_MASK": "255.255.0.0"})
    r = guest.run(LOC)
    assert r.returncode == 0, r.stdout
    assert guid == "02000a000064002a"
    assert guest.addrs("ib0") == ["10.100.0.42/16"]


def test_port_without_context_nic_is_reported(guest):
    guest.module("mlx5_core")
    guest.ib_port(guid="0002c90300a1b2c3")  # a GUID the driver did not derive
    guest.ethernet("eth0", "02:00:0a:00:00:2a")
    guest.env.update({"ETH0_MAC": "02:00:0a:00:00:2a", "ETH0_IP": "10.0.0.42"})
    r = guest.run(LOC)
    assert r.returncode == 0
    assert "IB port mlx5_0/1 GUID 0x0002c90300a1b2c3 matches no context NIC" in r.stdout
    assert guest.addrs("ib0") == [] and guest.addrs("eth0") == []


def test_port_in_init_state_points_at_the_subnet_manager(guest):
    fixture_guest(guest, state="2: INIT", lid="0x0")
    r = guest.run(LOC)
    assert r.returncode == 0
    assert "is INIT" in r.stdout and "subnet manager" in r.stdout


@pytest.mark.parametrize("script,stage", [(LOC, "local"), (NET, "network"), (SM, "network")])
def test_no_ib_device_is_a_clear_message_and_exit_0(guest, script, stage):
    guest.ethernet("eth0", "02:00:0a:00:00:2a")
    guest.env.update({"ETH0_MAC": "02:00:0a:00:00:2a", "IB_SUBNET_MANAGER": "YES"})
    r = guest.run(script, stage)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no InfiniBand device" in r.stdout
    assert guest.calls("modprobe") == []  # nothing Mellanox: no drivers loaded for nothing


def test_mellanox_function_without_ib_device_explains(guest):
    guest.pci(device="0x101e")
    r = guest.run(LOC)
    assert r.returncode == 0
    assert "Mellanox PCI function(s) present but no InfiniBand device" in r.stdout
    assert "mlx5_ib" in " ".join(guest.calls("modprobe"))


def test_modules_loaded_for_the_connectx_generation(guest):
    guest.module("mlx5_core", "ib_umad")  # ib_umad already loaded
    guest.pci(device="0x101e")
    guest.pci(addr="0000:00:06.0", device="0x1004")  # a ConnectX-3 Pro VF too
    r = guest.run(LOC)
    assert r.returncode == 0
    assert guest.calls("modprobe") == ["mlx5_ib", "mlx4_ib", "ib_ipoib", "rdma_ucm"]


# ------------------------------------------------------------------ interrupts

@pytest.mark.parametrize("profile,expected", [
    ("low-latency", ["-C ib0 adaptive-rx off", "-C ib0 rx-frames 1", "-C ib0 rx-usecs 0"]),
    ("throughput", ["-C ib0 adaptive-rx off", "-C ib0 rx-frames 88", "-C ib0 rx-usecs 40"]),
    ("default", []),
    (None, []),
])
def test_irq_profiles(guest, profile, expected):
    fixture_guest(guest)
    guest.recorder("ethtool")
    env = {"IB_ETHTOOL": str(guest.bin / "ethtool")}
    if profile:
        env["IB_IRQ_PROFILE"] = profile
    r = guest.run(LOC, env=env)
    assert r.returncode == 0, r.stdout
    assert guest.calls("ethtool") == expected
    if not expected:
        assert "interrupt moderation left at driver defaults" in r.stdout


def test_irq_override_and_unchanged(guest):
    fixture_guest(guest)
    guest.recorder("ethtool", rc=80)  # ethtool's "nothing changed"
    r = guest.run(LOC, env={"IB_ETHTOOL": str(guest.bin / "ethtool"), "IB_IRQ_PROFILE": "low-latency",
                            "IB_IRQ_RX_USECS": "8"})
    assert guest.calls("ethtool")[-1] == "-C ib0 rx-usecs 8"
    assert "rx-usecs 8 (unchanged)" in r.stdout


def test_irq_profile_on_a_driver_without_coalescing_warns_only(guest):
    """Real ethtool on the stand-in link: the driver refuses, the boot goes on."""
    fixture_guest(guest)
    r = guest.run(LOC, env={"IB_IRQ_PROFILE": "low-latency"})
    assert r.returncode == 0, r.stdout
    assert "adaptive-rx off not applied" in r.stdout or "adaptive-rx off (unchanged)" in r.stdout


def test_unknown_irq_profile(guest):
    fixture_guest(guest)
    guest.recorder("ethtool")
    r = guest.run(LOC, env={"IB_ETHTOOL": str(guest.bin / "ethtool"), "IB_IRQ_PROFILE": "turbo"})
    assert r.returncode == 0
    assert "IB_IRQ_PROFILE 'turbo' is not default|low-latency|throughput" in r.stdout
    assert guest.calls("ethtool") == []


# ------------------------------------------------------------------ user stack

def stack_guest(guest, os_id):
    """A guest whose os-release is os_id; run it with minimal_path() so the
    IB tools that may be installed on this machine stay out of sight."""
    fixture_guest(guest)
    osr = guest.tmp / "os-release"
    osr.write_text(os_id)
    guest.env["IB_OS_RELEASE"] = str(osr)


def minimal_path(guest):
    keep = guest.tmp / "sysbin"
    keep.mkdir(exist_ok=True)
    for tool in ("bash", "sh", "env", "tr", "sed", "awk", "sort", "grep", "cat", "mkdir", "dirname",
                 "readlink", "sleep", "mktemp", "rm", "cmp", "cp", "head", "ip", "flock", "mv"):
        src = shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin")
        if src and not (keep / tool).exists():
            os.symlink(src, keep / tool)
    return f"{guest.bin}:{keep}"


@pytest.mark.parametrize("os_id,tool,args", [
    ('ID=debian\nVERSION_ID="12"\n', "apt-get",
     "install -y -q --no-install-recommends rdma-core ibverbs-utils ibverbs-providers infiniband-diags"),
    ('ID=ubuntu\nID_LIKE=debian\n', "apt-get",
     "install -y -q --no-install-recommends rdma-core ibverbs-utils ibverbs-providers infiniband-diags"),
    ('ID="rocky"\nID_LIKE="rhel centos fedora"\n', "dnf", "install -y -q rdma-core libibverbs-utils infiniband-diags"),
])
def test_stack_installed_when_missing(guest, os_id, tool, args):
    stack_guest(guest, os_id)
    guest.recorder(tool)
    r = guest.run(NET, "network", env={"PATH": minimal_path(guest)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert guest.calls(tool) == [args]
    assert f"installing the IB user stack with {tool.split('-')[0]}" in r.stdout
    # and the IPoIB configuration is applied in the network stage too
    assert guest.addrs("ib0") == ["10.100.0.42/16"]


def test_stack_not_installed_when_present_or_refused(guest):
    stack_guest(guest, "ID=debian\n")
    apt = guest.recorder("apt-get")
    for t in ("ibstat", "ibv_devinfo", "rdma-ndd"):
        guest.recorder(t)
    r = guest.run(NET, "network", env={"PATH": minimal_path(guest)})
    assert "IB user stack present" in r.stdout
    for t in ("ibstat", "ibv_devinfo", "rdma-ndd"):
        (guest.bin / t).unlink()
    r = guest.run(NET, "network", env={"PATH": minimal_path(guest), "IB_INSTALL_STACK": "NO"})
    assert r.returncode == 0
    assert "IB_INSTALL_STACK=NO: not installing" in r.stdout
    assert not apt.exists()


def test_stack_install_failure_is_reported(guest):
    stack_guest(guest, "ID=debian\n")
    guest.recorder("apt-get", rc=100)
    r = guest.run(NET, "network", env={"PATH": minimal_path(guest)})
    assert r.returncode == 1
    assert "apt-get install rdma-core ibverbs-utils ibverbs-providers infiniband-diags failed" in r.stdout
    assert guest.addrs("ib0") == ["10.100.0.42/16"]  # IPoIB configured anyway


# ------------------------------------------------------------------ subnet manager hook

def test_sm_hook_does_nothing_unless_asked(guest):
    fixture_guest(guest)
    tool = guest.recorder("kvm-sriov-opensm")
    r = guest.run(SM, "network", env={"IB_SM_TOOL": str(guest.bin / "kvm-sriov-opensm")})
    assert r.returncode == 0 and r.stdout == ""
    assert not tool.exists()


def test_sm_hook_starts_opensm_with_priority_and_context_partitions(guest):
    fixture_guest(guest, device_id="0x1017")  # a ConnectX-5 PF passed through whole
    guest.recorder("opensm")
    guest.recorder("kvm-sriov-opensm", script='echo "prio=$IB_SM_PRIORITY parts=$IB_SM_PARTITIONS" >> "$0.env"')
    mount = guest.tmp / "context-cd"
    mount.mkdir()
    (mount / "partitions.conf").write_text("Default=0x7fff, ipoib : ALL=full;\n")
    parts = guest.tmp / "etc-opensm" / "partitions.conf"
    r = guest.run(SM, "network", env={"IB_SUBNET_MANAGER": "YES", "IB_SM_PRIORITY": "13",
                                      "IB_SM_TOOL": str(guest.bin / "kvm-sriov-opensm"),
                                      "MOUNT_DIR": str(mount), "IB_SM_PARTITIONS": str(parts)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert guest.calls("kvm-sriov-opensm") == ["start"]
    assert (guest.bin / "kvm-sriov-opensm.env").read_text().strip() == f"prio=13 parts={parts}"
    assert parts.read_text() == (mount / "partitions.conf").read_text()
    assert "Virtual Function" not in r.stdout


def test_sm_hook_warns_on_a_vf(guest):
    fixture_guest(guest, device_id="0x101e")
    guest.recorder("opensm")
    guest.recorder("kvm-sriov-opensm")
    r = guest.run(SM, "network", env={"IB_SUBNET_MANAGER": "YES",
                                      "IB_SM_TOOL": str(guest.bin / "kvm-sriov-opensm"),
                                      "IB_SM_PARTITIONS": str(guest.tmp / "p.conf")})
    assert r.returncode == 0
    assert "VFs have no QP0 and cannot act as subnet manager" in r.stdout
