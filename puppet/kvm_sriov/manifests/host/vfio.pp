# @summary vfio-pci loaded now and at every boot.
#
# libvirt binds a VF to vfio-pci when a VM with the VF starts
# (`managed='yes'`); loading the modules up front makes a missing module
# show at Puppet time, not at the first deploy.
#
# @api private
class kvm_sriov::host::vfio {
  assert_private()

  $host = $kvm_sriov::host

  if $host::manage_vfio {
    file { "${host::modules_load_dir}/kvm-sriov.conf":
      ensure  => file,
      owner   => 'root',
      group   => 'root',
      mode    => '0644',
      content => epp('kvm_sriov/modules-load.conf.epp', { 'modules' => $host::vfio_modules }),
    }

    $host::vfio_modules.each |$mod| {
      exec { "kvm_sriov-modprobe-${mod}":
        command => "modprobe ${mod}",
        unless  => "test -d '${host::sysfs_root}/module/${mod}'",
        path    => ['/usr/sbin', '/usr/bin', '/sbin', '/bin'],
      }
    }
  }
}
