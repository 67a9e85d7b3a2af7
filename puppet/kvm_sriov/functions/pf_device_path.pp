# @summary The sysfs folder of a PF's PCI device, from any of its names.
#
# A PCI address (a missing domain means `0000`) is looked up under
# `bus/pci/devices`, an IB device (`mlx4_0`, `mlx5_1`) under
# `class/infiniband/<dev>/device`, anything else as a netdev under
# `class/net/<dev>/device`.
#
# @param pf The PF name.
# @param sysfs_root Where sysfs is mounted (tests use a fake tree).
# @return [String] The folder holding `sriov_numvfs`.
function kvm_sriov::pf_device_path(Kvm_sriov::Pfname $pf, String $sysfs_root = '/sys') >> String {
  $root = regsubst($sysfs_root, '/+\z', '')
  if $pf =~ Kvm_sriov::Pciaddress {
    $address = $pf ? {
      /\A[0-9a-fA-F]{4}:/ => downcase($pf),
      default             => downcase("0000:${pf}"),
    }
    "${root}/bus/pci/devices/${address}"
  } elsif $pf =~ /\Amlx[45]_[0-9]+\z/ {
    "${root}/class/infiniband/${pf}/device"
  } else {
    "${root}/class/net/${pf}/device"
  }
}
