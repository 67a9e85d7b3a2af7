"""Simulated hosts for the kvm-sriov demo and tests (see docs/simhost.md).

guest_image   a tiny cached guest (Debian kernel + busybox initramfs)
libvirt_host  a private libvirtd per simulated host (rung 2)
nested        an outer QEMU guest with real SR-IOV VFs and VFIO (rung 3)
"""
