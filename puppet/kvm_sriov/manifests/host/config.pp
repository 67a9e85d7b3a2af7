# @summary The host-local driver config `/etc/kvm-sriov/kvm-sriov.toml`.
#
# Layer 3 of docs/conventions.md: only the keys set here are written, so the
# cluster-wide file from the remotes (layer 2) keeps every other key.
#
# @api private
class kvm_sriov::host::config {
  assert_private()

  $host = $kvm_sriov::host

  $typed = {
    'pool'        => {
      'pfs'                       => $host::pool_pfs,
      'skip_vfs_in_host_use'      => $host::skip_vfs_in_host_use,
      'state_dir'                 => $host::state_dir,
      'reservation_grace_seconds' => $host::reservation_grace_seconds,
      'numa_policy'               => $host::numa_policy,
    },
    'network'     => { 'bridge' => $host::bridge },
    'libvirt'     => { 'uri' => $host::libvirt_uri },
    'timeouts'    => {
      'shutdown_seconds' => $host::shutdown_seconds,
      'lock_seconds'     => $host::lock_seconds,
    },
    'infiniband'  => {
      'guid_policy'     => $host::guid_policy,
      'partitions_file' => $host::partitions_file,
    },
  }
  $sections = kvm_sriov::merge_settings($host::settings, $typed)

  file { dirname($host::config_file):
    ensure => directory,
    owner  => 'root',
    group  => 'root',
    mode   => '0755',
  }

  file { $host::config_file:
    ensure  => file,
    owner   => $host::config_owner,
    group   => $host::config_group,
    mode    => '0644',
    content => epp('kvm_sriov/kvm-sriov.toml.epp', {
        'sections' => $sections,
        'origin'   => 'kvm_sriov::host',
        'layer'    => 'host-local overrides (/etc/kvm-sriov/kvm-sriov.toml)',
    }),
  }

  if $host::manage_state_dir and $host::state_dir {
    file { $host::state_dir:
      ensure => directory,
      owner  => $host::remotes_owner,
      group  => $host::remotes_group,
      mode   => '0750',
    }
  }
}
