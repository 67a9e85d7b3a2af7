# @summary The size of /dev/shm, where the shared-memory regions of
#   co-resident VMs live (KVM_SRIOV_IVSHMEM, docs/ivshmem.md).
#
# Every region is a file in /dev/shm (a tmpfs) that QEMU maps; its pages
# count against the tmpfs size and against the host's memory. Debian mounts
# /dev/shm at half the RAM; a host that runs VM groups with large regions
# gets a size that fits them all. The size goes into /etc/fstab (the
# mount at boot) and, on a change, /dev/shm is remounted with it now:
# tmpfs takes a new size live, and refuses one below what is in use.
# The regions need no hugepages (a plain tmpfs file backs the device).
#
# @api private
class kvm_sriov::host::shm {
  assert_private()

  if $kvm_sriov::host::shm_size {
    $size = $kvm_sriov::host::shm_size
    file_line { 'kvm_sriov-fstab-dev-shm':
      path               => $kvm_sriov::host::fstab_file,
      line               => "tmpfs /dev/shm tmpfs defaults,nosuid,nodev,size=${size} 0 0",
      match              => '^\s*[^#\s]+\s+/dev/shm\s',
      append_on_no_match => true,
      notify             => Exec['kvm_sriov-remount-dev-shm'],
    }

    exec { 'kvm_sriov-remount-dev-shm':
      command     => pick($kvm_sriov::host::shm_remount_command, "mount -o remount,size=${size} /dev/shm"),
      path        => ['/usr/sbin', '/usr/bin', '/sbin', '/bin'],
      refreshonly => true,
      logoutput   => true,
    }
  }
}
