# @summary libvirt/QEMU and the Python the host driver runs on.
#
# The driver talks to `qemu:///system` through Debian's python3-libvirt, the
# only package it imports beyond the standard library (docs/conventions.md). libvirt
# binds VFs to vfio-pci itself (`<hostdev managed='yes'>`); with QEMU running
# as oneadmin and `dynamic_ownership = 0` (OpenNebula's qemu.conf) the
# `/dev/vfio/<group>` nodes must be reachable by QEMU's group, which the
# optional udev rule provides.
#
# @api private
class kvm_sriov::host::libvirt {
  assert_private()


  if $kvm_sriov::host::manage_libvirt {
    ensure_packages($kvm_sriov::host::libvirt_packages + $kvm_sriov::host::python_packages)

    if $kvm_sriov::host::manage_libvirt_service {
      service { $kvm_sriov::host::libvirt_service:
        ensure  => running,
        enable  => true,
        require => Package[$kvm_sriov::host::libvirt_packages],
      }
    }
  }

  $rule = "${kvm_sriov::host::udev_rules_dir}/70-kvm-sriov-vfio.rules"
  if $kvm_sriov::host::vfio_udev_rule {
    file { $rule:
      ensure  => file,
      owner   => 'root',
      group   => 'root',
      mode    => '0644',
      content => epp('kvm_sriov/vfio.rules.epp', {
          'group' => $kvm_sriov::host::vfio_group,
          'mode'  => $kvm_sriov::host::vfio_mode,
      }),
    }
  } else {
    file { $rule:
      ensure => absent,
    }
  }
}
