# @summary The VF count of one InfiniBand PF.
#
# mlx5 (default): writes `sriov_numvfs` now (0 first, then `numvfs`) unless it
# already holds `numvfs`, and leaves a file for `kvm-sriov-vfs.service` to do
# the same at every boot before libvirt starts. Changing the count of a PF
# whose VFs a VM holds (bound to vfio-pci) is refused unless `force` is set:
# the kernel destroys every VF of the PF on a change.
#
# mlx4 (ConnectX-3): the count is a mlx4_core module option; declare such PFs
# through `kvm_sriov::host::pfs` (the one modprobe file is built from it).
#
# Declare `kvm_sriov::host` first; its `pfs` parameter declares these for you.
#
# @example
#   kvm_sriov::pf { '0000:03:00.0':
#     numvfs            => 8,
#     drivers_autoprobe => false,
#   }
#
# @param numvfs
#   How many VFs (0 removes them).
# @param driver
#   `mlx5` (sysfs) or `mlx4` (modprobe options).
# @param drivers_autoprobe
#   Write `sriov_drivers_autoprobe` first: `false` keeps the host driver off
#   new VFs (they wait for vfio-pci); mlx4: `true` probes them on the host
#   (`probe_vf`). `undef` leaves the kernel default.
# @param force
#   Change the count even while VMs hold VFs.
define kvm_sriov::pf (
  Integer[0, 255] $numvfs,
  Enum['mlx5', 'mlx4'] $driver         = 'mlx5',
  Optional[Boolean] $drivers_autoprobe = undef,
  Boolean $force                       = false,
) {
  unless $title =~ Kvm_sriov::Pfname {
    fail("kvm_sriov::pf: '${title}' is not a PCI address, IB device or netdev name")
  }
  unless defined(Class['kvm_sriov::host']) {
    fail("kvm_sriov::pf '${title}': declare class kvm_sriov::host before its PFs")
  }

  if $driver == 'mlx4' {
    unless $title =~ Kvm_sriov::Pciaddress {
      fail("kvm_sriov::pf '${title}': mlx4 VF counts are per PCI address (mlx4_core num_vfs); give the PF as e.g. 0000:04:00.0")
    }
    unless $title in $kvm_sriov::host::pfs {
      fail("kvm_sriov::pf '${title}': mlx4 PFs must be listed in kvm_sriov::host::pfs (one modprobe file holds them all)")
    }
  } else {
    $device = kvm_sriov::pf_device_path($title, $kvm_sriov::host::sysfs_root)
    $helper = "${kvm_sriov::host::helper_dir}/kvm-sriov-vfs"
    $safe = regsubst($title, '[^A-Za-z0-9_.-]', '_', 'G')

    file { "${kvm_sriov::host::vfs_config_dir}/${safe}.conf":
      ensure  => file,
      owner   => 'root',
      group   => 'root',
      mode    => '0644',
      content => epp('kvm_sriov/vfs.conf.epp', {
          'pf'        => $title,
          'device'    => $device,
          'numvfs'    => $numvfs,
          'autoprobe' => $drivers_autoprobe,
      }),
    }

    $opts = [
      $drivers_autoprobe ? {
        undef   => [],
        true    => ['--autoprobe', '1'],
        default => ['--autoprobe', '0'],
      },
      $force ? {
        true    => ['--force'],
        default => [],
      },
    ].flatten

    # Shell strings so a noop run before the helper exists skips the check
    # instead of failing on a missing command.
    $check = shell_join([$helper, 'check', $device, String($numvfs)] + ($opts - ['--force']))
    exec { "kvm_sriov-numvfs-${title}":
      command   => shell_join([$helper, 'set', $device, String($numvfs)] + $opts),
      unless    => "test ! -x ${shell_escape($helper)} || ${check}",
      provider  => 'shell',
      logoutput => true,
      require   => File[$helper],
    }
  }
}
