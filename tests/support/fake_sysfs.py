"""Build a realistic fake sysfs tree (rung 1): PCI devices with relative
symlinks exactly where the kernel puts them, IOMMU groups, drivers, SR-IOV
attributes, and the mlx5 / mlx4 InfiniBand class folders with GUID files.

Writes the driver makes to the kernel (kvm_sriov.vf.sysfs.write_attribute)
reach the tree through ``kernel_write``, which does what the kernel does:
``sriov_numvfs`` makes VFs appear and disappear, a driver's ``unbind``,
``driver_override`` and ``drivers_probe`` move a device between drivers.
``install_kernel(monkeypatch)`` routes them there."""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

ALL_F = "ff:ff:ff:ff:ff:ff:ff:ff"


def _rid(address: str) -> int:
    _dom, bus, rest = address.split(":")
    slot, fn = rest.split(".")
    return int(bus, 16) << 8 | int(slot, 16) << 3 | int(fn, 16)


def _address(rid: int) -> str:
    return f"0000:{rid >> 8:02x}:{(rid >> 3) & 0x1f:02x}.{rid & 7}"


@dataclass
class FakeSysfs:
    root: Path
    _next_group: int = 10
    groups: dict = field(default_factory=dict)  # address -> group
    dirs: dict = field(default_factory=dict)    # address -> its folder when not under pci0000:00
    home: dict = field(default_factory=dict)    # address -> the driver a probe binds it to
    sriov: dict = field(default_factory=dict)   # PF address -> how its VFs are made (add_pf)
    # drivers that can change a PF's VF count through sriov_numvfs (the
    # kernel's sriov_configure callback): not mlx4_core (module options), not vfio-pci
    SRIOV_CONFIGURE = ("mlx5_core",)

    def __post_init__(self):
        self.root = Path(self.root)
        self.sys = self.root / "sys"
        for d in ("bus/pci/devices", "bus/pci/drivers", "kernel/iommu_groups",
                  "class/infiniband", "class/net", "devices/pci0000:00", "devices/system/node"):
            (self.sys / d).mkdir(parents=True, exist_ok=True)

    # -- low level ------------------------------------------------------
    def dev(self, address: str) -> Path:
        return self.dirs.get(address) or self.sys / "devices" / "pci0000:00" / address

    def _place(self, address: str, parent) -> None:
        """parent: None (on pci0000:00's bus, as before), a host bridge's folder
        name ("pci0000:40") or the address of a bridge added before: the device's
        folder nests under it, as the kernel lays out the PCI tree."""
        if parent is None:
            return
        base = self.sys / "devices" / parent if parent.startswith("pci") else self.dev(parent)
        self.dirs[address] = base / address

    @staticmethod
    def _link(link: Path, target: Path) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        os.symlink(os.path.relpath(target, link.parent), link)

    @staticmethod
    def _write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    def add_device(self, address: str, vendor="8086", device="1234", cls=0x060400,
                   numa=0, driver=None, group=None, parent=None) -> Path:
        self._place(address, parent)
        d = self.dev(address)
        d.mkdir(parents=True, exist_ok=True)
        self._write(d / "vendor", f"0x{vendor}")
        self._write(d / "device", f"0x{device}")
        self._write(d / "class", f"0x{cls:06x}")
        self._write(d / "numa_node", str(numa))
        self._link(self.sys / "bus/pci/devices" / address, d)
        self.home.setdefault(address, driver)
        self.bind(address, driver)
        if group is not False:
            self.set_group(address, group)
        return d

    def set_group(self, address: str, group=None) -> None:
        if group is None:
            group = self._next_group
            self._next_group += 1
        old = self.groups.get(address)
        if old is not None:
            (self.sys / "kernel/iommu_groups" / str(old) / "devices" / address).unlink()
        self.groups[address] = group
        gdir = self.sys / "kernel/iommu_groups" / str(group)
        self._link(gdir / "devices" / address, self.dev(address))
        self._link(self.dev(address) / "iommu_group", gdir)

    def bind(self, address: str, driver) -> None:
        """Like the kernel: <dev>/driver -> the driver, and the driver's folder
        lists its devices (/sys/bus/pci/drivers/<drv>/<address> -> <dev>)."""
        link = self.dev(address) / "driver"
        if link.is_symlink():
            old = self.sys / "bus/pci/drivers" / os.path.basename(os.readlink(link)) / address
            if old.is_symlink():
                old.unlink()
            link.unlink()
        if driver:
            drv = self.sys / "bus/pci/drivers" / driver
            drv.mkdir(parents=True, exist_ok=True)
            self._link(link, drv)
            self._link(drv / address, self.dev(address))

    def add_netdev(self, address: str, name: str, up: bool = False) -> None:
        nd = self.dev(address) / "net" / name
        self._write(nd / "flags", "0x1003" if up else "0x1002")
        self._write(nd / "operstate", "up" if up else "down")
        self._link(self.sys / "class/net" / name, nd)

    def add_ib_device(self, address: str, name: str, ports=1, state="4: ACTIVE",
                      rate="100 Gb/sec (4X EDR)", node_guid="e41d:2d03:0060:0001") -> Path:
        ib = self.dev(address) / "infiniband" / name
        self._write(ib / "node_guid", node_guid)
        for p in range(1, ports + 1):
            pdir = ib / "ports" / str(p)
            self._write(pdir / "state", state)
            self._write(pdir / "phys_state", "5: LinkUp")
            self._write(pdir / "rate", rate)
            self._write(pdir / "lid", "0x1")
            self._write(pdir / "link_layer", "InfiniBand")
            port_guid = node_guid.replace(":", "")[:-4] + f"{int(node_guid[-4:], 16) + p:04x}"
            gid = "fe80:0000:0000:0000:" + ":".join(port_guid[i:i + 4] for i in range(0, 16, 4))
            self._write(pdir / "gids" / "0", gid)
            self._write(pdir / "pkeys" / "0", "0xffff")
        self._link(ib / "device", self.dev(address))
        self._link(self.sys / "class/infiniband" / name, ib)
        return ib

    # -- SR-IOV PFs -------------------------------------------------------
    def add_pf(self, address: str, *, layout="mlx5", numa=0, num_vfs=4, total_vfs=8,
               netdev="ib0", ibdev=None, cls=0x020700, vendor="15b3", device=None,
               vf_device=None, vf_driver=None, iommu=True, guid_files=True,
               node_guid=None, parent=None) -> list[str]:
        """An SR-IOV PF and its enabled VFs; returns the VF addresses.

        guid_files=False: no per-VF GUID files (only netlink can set them);
        parent: where the PF and its VFs sit (see add_device)."""
        mlx4 = layout == "mlx4"
        device = device or ("1003" if mlx4 else "1017")
        vf_device = vf_device or ("1004" if mlx4 else "1018")
        driver = "mlx4_core" if mlx4 else "mlx5_core"
        d = self.add_device(address, vendor, device, cls, numa, driver,
                            group=None if iommu else False, parent=parent)
        for attr, val in (("sriov_totalvfs", total_vfs), ("sriov_numvfs", 0),
                          ("sriov_offset", 1), ("sriov_stride", 1),
                          ("sriov_vf_device", vf_device), ("sriov_drivers_autoprobe", 1)):
            self._write(d / attr, str(val))
        self._write(d / "driver_override", "(null)")
        if netdev:
            self.add_netdev(address, netdev, up=True)
        ibdev = ibdev if ibdev is not None else ("mlx4_0" if mlx4 else "mlx5_0")
        if ibdev:
            self.add_ib_device(address, ibdev, node_guid=node_guid or
                               f"e41d:2d03:00{_rid(address) >> 8:02x}:0001")
        self.sriov[address] = dict(vendor=vendor, vf_device=vf_device, cls=cls, numa=numa,
                                   vf_driver=vf_driver, iommu=iommu, parent=parent, mlx4=mlx4,
                                   ibdev=ibdev, guid_files=guid_files)
        return self._add_vfs(address, num_vfs)

    def _add_vfs(self, pf: str, count: int) -> list[str]:
        """The PF's VFs 0..count-1 appear, as the kernel makes them."""
        how, d = self.sriov[pf], self.dev(pf)
        vfs = []
        for i in range(count):
            vf = _address(_rid(pf) + 1 + i)
            self.add_device(vf, how["vendor"], how["vf_device"], how["cls"], how["numa"], how["vf_driver"],
                            group=None if how["iommu"] else False, parent=how["parent"])
            self._link(self.dev(vf) / "physfn", d)
            self._link(d / f"virtfn{i}", self.dev(vf))
            if how["ibdev"] and how["guid_files"] and not how["mlx4"]:  # mlx5: PF's device/sriov/<vf>/...
                for name, val in (("node", ALL_F), ("port", ALL_F), ("policy", "Down")):
                    self._write(d / "sriov" / str(i) / name, val)
            if how["ibdev"] and how["guid_files"] and how["mlx4"]:      # mlx4: iov/ports/<p>/admin_guids/<vf+1>
                ib = self.sys / "class/infiniband" / how["ibdev"]
                self._write(ib / "iov/ports/1/admin_guids" / str(i + 1), "0x0")
            vfs.append(vf)
        self._write(d / "sriov_numvfs", str(count))
        return vfs

    def _remove_vfs(self, pf: str) -> None:
        """Every VF of the PF disappears, with all that named it."""
        d = self.dev(pf)
        for link in sorted(d.glob("virtfn*")):
            vf = os.path.basename(os.readlink(link))
            self.bind(vf, None)
            group = self.groups.pop(vf, None)
            if group is not None:
                gdir = self.sys / "kernel/iommu_groups" / str(group)
                (gdir / "devices" / vf).unlink()
                if not any((gdir / "devices").iterdir()):
                    shutil.rmtree(gdir)
            vdir = self.dev(vf)
            for net in (self.sys / "class/net").iterdir():
                if net.is_symlink() and str(net.resolve()).startswith(str(vdir.resolve()) + os.sep):
                    net.unlink()
            (self.sys / "bus/pci/devices" / vf).unlink()
            shutil.rmtree(vdir)
            self.dirs.pop(vf, None)
            self.home.pop(vf, None)
            link.unlink()
        shutil.rmtree(d / "sriov", ignore_errors=True)
        ibdev = self.sriov[pf]["ibdev"]
        if ibdev:
            shutil.rmtree(self.sys / "class/infiniband" / ibdev / "iov", ignore_errors=True)
        self._write(d / "sriov_numvfs", "0")

    # -- the kernel's side of a write ---------------------------------------
    def driver_of(self, address: str):
        link = self.dev(address) / "driver"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else None

    def kernel_write(self, path, text: str) -> None:
        """A write to a kernel attribute, answered as the kernel does (an
        OSError with its errno); any other file is just written."""
        path = Path(path)
        value = text.strip()
        if path == self.sys / "bus/pci/drivers_probe":
            if self.driver_of(value) is None:
                override = (self.dev(value) / "driver_override").read_text().strip() \
                    if (self.dev(value) / "driver_override").exists() else "(null)"
                self.bind(value, self.home.get(value) if override == "(null)" else override)
            return
        if path.parent.parent == self.sys / "bus/pci/drivers" and path.name in ("unbind", "bind"):
            if path.name == "bind":
                self.bind(value, path.parent.name)
            elif self.driver_of(value) != path.parent.name:
                raise OSError(errno.ENODEV, os.strerror(errno.ENODEV), str(path))
            else:
                self.bind(value, None)
            return
        if not path.exists():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        address = os.path.basename(os.path.realpath(path.parent))
        if path.name == "driver_override":
            self._write(path, value or "(null)")
        elif path.name == "sriov_numvfs" and address in self.sriov:
            self._set_num_vfs(address, value, path)
        else:
            path.write_text(text)

    def _set_num_vfs(self, pf: str, value: str, path: Path) -> None:
        """drivers/pci/iov.c, sriov_numvfs_store."""
        try:
            n = int(value, 0)
        except ValueError:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(path)) from None
        d = self.dev(pf)
        if n < 0 or n > int((d / "sriov_totalvfs").read_text()):
            raise OSError(errno.ERANGE, os.strerror(errno.ERANGE), str(path))
        now = int((d / "sriov_numvfs").read_text())
        if n == now:
            return
        if self.driver_of(pf) not in self.SRIOV_CONFIGURE:
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        if n == 0:
            self._remove_vfs(pf)
        elif now:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
        else:
            self._add_vfs(pf, n)

    def free_to_go_whole(self, monkeypatch, pf: str = "0000:03:00.0") -> "FakeSysfs":
        """The reference host's mlx5 PF free to be passed through whole (its
        netdev down, no VF in host use), with the fake kernel on."""
        self.add_netdev(pf, "ib0", up=False)
        self.bind("0000:03:00.3", None)
        return self.install_kernel(monkeypatch)

    def install_kernel(self, monkeypatch) -> "FakeSysfs":
        """The driver's writes to sysfs go to kernel_write (for this test)."""
        from kvm_sriov.vf import sysfs
        monkeypatch.setattr(sysfs, "write_attribute", self.kernel_write)
        return self


    # -- PCI bridges (root ports, PCIe switch ports) --------------------------
    def add_bridge(self, address: str, parent=None, numa=0, vendor="8086", device="1234") -> Path:
        """A PCI bridge (class 0x0604): a root port on a host bridge
        (parent="pci0000:40"), or a switch's upstream or downstream port
        (parent: the bridge above it). Devices behind it name it as parent."""
        return self.add_device(address, vendor, device, 0x060400, numa, parent=parent)

    # -- NUMA ---------------------------------------------------------------
    def add_numa_node(self, node: int, cpulist: str) -> None:
        self._write(self.sys / "devices/system/node" / f"node{node}" / "cpulist", cpulist)


def standard_host(root: Path) -> dict:
    """The rung-1 reference host.

    - mlx5 PF 0000:03:00.0 (NUMA 0, ib0, mlx5_0), 4 VFs 03:00.1-.4
    - mlx4 PF 0000:81:00.0 (NUMA 1, ib1, mlx4_0), 4 VFs 81:00.1-.4;
      VF 81:00.4 shares its IOMMU group with a bridge 0000:80:01.0
    - mlx5 PF 0000:04:00.0 with SR-IOV capable but VFs disabled
    - Ethernet ConnectX PF 0000:05:00.0 (class 0x0200) with 2 VFs
    - 03:00.3 bound to mlx5_core with its netdev up (host in use);
      03:00.2 bound to mlx5_core but down; the rest unbound
    """
    fs = FakeSysfs(root)
    fs.add_device("0000:00:00.0", cls=0x060000)
    mlx5 = fs.add_pf("0000:03:00.0", numa=0, netdev="ib0")
    mlx4 = fs.add_pf("0000:81:00.0", layout="mlx4", numa=1, netdev="ib1")
    fs.add_device("0000:80:01.0", numa=1)
    fs.set_group("0000:80:01.0", fs.groups["0000:81:00.4"])
    fs.add_pf("0000:04:00.0", numa=0, num_vfs=0, netdev="ib2", ibdev="mlx5_1")
    eth = fs.add_pf("0000:05:00.0", numa=0, num_vfs=2, cls=0x020000, netdev="enp5s0",
                    ibdev="", device="1015", vf_device="1016")
    fs.bind("0000:03:00.3", "mlx5_core")
    fs.add_netdev("0000:03:00.3", "ib3", up=True)
    fs.bind("0000:03:00.2", "mlx5_core")
    fs.add_netdev("0000:03:00.2", "ib4", up=False)
    fs.add_numa_node(0, "0-3")
    fs.add_numa_node(1, "4-7")
    return {"fs": fs, "mlx5_vfs": mlx5, "mlx4_vfs": mlx4, "eth_vfs": eth}


def big_host(root: Path, pfs: int = 4, vfs: int = 127) -> FakeSysfs:
    """The benchmark host: ``pfs`` mlx5 PFs with ``vfs`` VFs each, on two NUMA nodes."""
    fs = FakeSysfs(root)
    fs.add_numa_node(0, "0-15")
    fs.add_numa_node(1, "16-31")
    for n in range(pfs):
        fs.add_pf(f"0000:{0x10 + n:02x}:00.0", numa=n % 2, num_vfs=vfs, total_vfs=vfs,
                  netdev=f"ib{n}", ibdev=f"mlx5_{n}")
    return fs
