# @summary The host-local driver config `/etc/kvm-sriov/kvm-sriov.toml`.
#
# Layer 3 of docs/conventions.md: only the keys set here are written, so the
# cluster-wide file from the remotes (layer 2) keeps every other key.
#
# @api private
class kvm_sriov::host::config {
  assert_private()


  $typed = {
    'pool'        => {
      'pfs'                       => $kvm_sriov::host::pool_pfs,
      'skip_vfs_in_host_use'      => $kvm_sriov::host::skip_vfs_in_host_use,
      'state_dir'                 => $kvm_sriov::host::state_dir,
      'reservation_grace_seconds' => $kvm_sriov::host::reservation_grace_seconds,
      'numa_policy'               => $kvm_sriov::host::numa_policy,
    },
    'network'     => { 'bridge' => $kvm_sriov::host::bridge },
    'libvirt'     => { 'uri' => $kvm_sriov::host::libvirt_uri },
    'timeouts'    => {
      'shutdown_seconds' => $kvm_sriov::host::shutdown_seconds,
      'lock_seconds'     => $kvm_sriov::host::lock_seconds,
    },
    'infiniband'  => {
      'guid_policy'     => $kvm_sriov::host::guid_policy,
      'partitions_file' => $kvm_sriov::host::partitions_file,
    },
  }
  $sections = kvm_sriov::merge_settings($kvm_sriov::host::settings, $typed)

  file { dirname($kvm_sriov::host::config_file):
    ensure => directory,
    owner  => 'root',
    group  => 'root',
    mode   => '0755',
  }

  file { $kvm_sriov::host::config_file:
    ensure  => file,
    owner   => $kvm_sriov::host::config_owner,
    group   => $kvm_sriov::host::config_group,
    mode    => '0644',
    content => epp('kvm_sriov/kvm-sriov.toml.epp', {
        'sections' => $sections,
        'origin'   => 'kvm_sriov::host',
        'layer'    => 'host-local overrides (/etc/kvm-sriov/kvm-sriov.toml)',
    }),
  }

  if $kvm_sriov::host::manage_state_dir and $kvm_sriov::host::state_dir {
    file { $kvm_sriov::host::state_dir:
      ensure => directory,
      owner  => $kvm_sriov::host::remotes_owner,
      group  => $kvm_sriov::host::remotes_group,
      mode   => '0750',
    }
  }
}
