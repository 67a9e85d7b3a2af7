# @summary What every PF's VF count needs: the helper, the boot unit and the
#   mlx4 modprobe options.
#
# mlx5 (ConnectX-4 and later): `kvm-sriov-vfs.service` writes
# `sriov_numvfs` (0 first) at boot before libvirt starts, from one file per
# PF in `vfs_config_dir`; `kvm_sriov::pf` also sets it at once. mlx4
# (ConnectX-3): the count is a module option (`num_vfs`, `probe_vf`) in one
# modprobe file built from `kvm_sriov::host::pfs`; it takes effect when
# mlx4_core is reloaded (reboot).
#
# @api private
class kvm_sriov::host::vfs {
  assert_private()

  $helper = "${kvm_sriov::host::helper_dir}/kvm-sriov-vfs"
  $unit = "${kvm_sriov::host::systemd_dir}/kvm-sriov-vfs.service"

  file { $helper:
    ensure => file,
    owner  => 'root',
    group  => 'root',
    mode   => '0755',
    source => 'puppet:///modules/kvm_sriov/kvm-sriov-vfs',
  }

  # The config class manages the folder of the host config file.
  if dirname($kvm_sriov::host::vfs_config_dir) != dirname($kvm_sriov::host::config_file) {
    file { dirname($kvm_sriov::host::vfs_config_dir):
      ensure => directory,
      owner  => 'root',
      group  => 'root',
      mode   => '0755',
    }
  }

  file { $kvm_sriov::host::vfs_config_dir:
    ensure  => directory,
    owner   => 'root',
    group   => 'root',
    mode    => '0755',
    recurse => true,
    purge   => true,
  }

  file { $unit:
    ensure  => file,
    owner   => 'root',
    group   => 'root',
    mode    => '0644',
    content => epp('kvm_sriov/kvm-sriov-vfs.service.epp', {
        'helper'     => $helper,
        'config_dir' => $kvm_sriov::host::vfs_config_dir,
    }),
  }

  # `systemctl enable` is this link; made by hand so a throwaway root works.
  file { "${kvm_sriov::host::systemd_dir}/multi-user.target.wants/kvm-sriov-vfs.service":
    ensure  => link,
    target  => $unit,
    require => File[$unit],
  }

  $mlx4 = $kvm_sriov::host::pfs.filter |$pf, $cfg| { $cfg['driver'] == 'mlx4' }
  $mlx4_file = "${kvm_sriov::host::modprobe_dir}/kvm-sriov-mlx4.conf"
  if $mlx4.empty {
    file { $mlx4_file:
      ensure => absent,
    }
  } else {
    $addresses = $mlx4.map |$pf, $cfg| {
      $pf ? {
        /\A[0-9a-fA-F]{4}:/ => [downcase($pf), $cfg],
        default             => [downcase("0000:${pf}"), $cfg],
      }
    }
    $port_types = $kvm_sriov::host::mlx4_port_type_array ? {
      false   => undef,
      default => $kvm_sriov::host::mlx4_port_type_array,
    }
    file { $mlx4_file:
      ensure  => file,
      owner   => 'root',
      group   => 'root',
      mode    => '0644',
      content => epp('kvm_sriov/mlx4_core.conf.epp', {
          'num_vfs'         => $addresses.map |$a| { "${a[0]}-${a[1]['numvfs']}" }.join(','),
          'probe_vf'        => $addresses.map |$a| {
            "${a[0]}-${a[1]['drivers_autoprobe'] ? { true => $a[1]['numvfs'], default => 0 }}"
          }.join(','),
          'port_type_array' => $port_types,
      }),
    }
    exec { 'kvm_sriov-mlx4-notice':
      command     => "echo 'kvm_sriov: mlx4_core VF options changed in ${mlx4_file}: reload mlx4_core or reboot'",
      path        => ['/usr/bin', '/bin'],
      refreshonly => true,
      logoutput   => true,
      subscribe   => File[$mlx4_file],
    }
  }
}
