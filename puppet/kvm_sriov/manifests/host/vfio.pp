# @summary vfio-pci loaded now and at every boot.
#
# libvirt binds a VF to vfio-pci when a VM with the VF starts
# (`managed='yes'`); loading the modules up front makes a missing module
# show at Puppet time, not at the first deploy.
#
# @api private
class kvm_sriov::host::vfio {
  assert_private()


  if $kvm_sriov::host::manage_vfio {
    file { "${kvm_sriov::host::modules_load_dir}/kvm-sriov.conf":
      ensure  => file,
      owner   => 'root',
      group   => 'root',
      mode    => '0644',
      content => epp('kvm_sriov/modules-load.conf.epp', { 'modules' => $kvm_sriov::host::vfio_modules }),
    }

    $kvm_sriov::host::vfio_modules.each |$mod| {
      exec { "kvm_sriov-modprobe-${mod}":
        command => "modprobe ${mod}",
        unless  => "test -d '${kvm_sriov::host::sysfs_root}/module/${mod}'",
        path    => ['/usr/sbin', '/usr/bin', '/sbin', '/bin'],
      }
    }
  }
}
