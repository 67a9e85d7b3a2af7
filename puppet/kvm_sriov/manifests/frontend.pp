# @summary The OpenNebula front-end side of kvm-sriov.
#
# Installs the driver into the remotes (`vmm/kvm-sriov`, its library,
# the `im/` probes, the cluster-wide config), registers the `VM_MAD` in
# oned.conf (between marker lines, by a small helper) and puts the VM and
# network templates where admins can `onetemplate create`/`onevnet create`
# them. With `manage_sched_mad` it also selects the VF-aware placer in
# oned.conf's `SCHED_MAD` (docs/scheduling.md). oned reads oned.conf at start only: give `oned_service` to have it
# restarted on a change, else a notice says so. Hosts get the remotes with
# `onehost sync` (or `onehost_sync => true`).
#
# @example From a checkout of the driver
#   class { 'kvm_sriov::frontend':
#     source => '/opt/kvm-sriov',
#   }
#
# @param source
#   The driver's source tree (absolute path or `puppet:///` URL).
# @param package
#   Or a package shipping the remotes (then templates come with it too).
# @param remotes_dir
#   OpenNebula's remotes on the front-end.
# @param owner
#   Owner of installed files.
# @param group
#   Group of installed files.
# @param config_settings
#   Render the cluster-wide `remotes/etc/vmm/kvm-sriov/kvm-sriov.toml` from
#   these settings (by section); `undef` copies the source's default once.
# @param manage_vm_mad
#   Keep the VM_MAD entry in oned.conf.
# @param manage_sched_mad
#   Select the kvm-sriov placer in oned.conf (`SCHED_MAD` `ARGUMENTS`
#   `-p kvm-sriov`, the rest of the line kept). `false` is the way back:
#   a `-p kvm-sriov` there becomes the stock `-p rank` again (any other
#   placer is left alone). Needs `source` (the placer is installed from it).
# @param oned_conf
#   oned's configuration file.
# @param helper_dir
#   Where the oned.conf helper is installed.
# @param snippet_file
#   The rendered VM_MAD entry the helper puts into oned.conf.
# @param mad_name
#   VM_MAD NAME (the `-v` of `onehost create`) and the remotes folder.
# @param sunstone_name
#   Name shown in Sunstone.
# @param threads
#   `-t`: actions run at once by the MAD.
# @param retries
#   `-r`: retries of a failed action.
# @param parallel
#   `-p`: several actions on one host at once (the driver locks itself).
# @param local_actions
#   `-l`: actions run on the front-end (`action` or `action=script`).
# @param default_conf
#   DEFAULT: the driver defaults file, relative to /etc/one.
# @param keep_snapshots
#   KEEP_SNAPSHOTS.
# @param live_resize
#   LIVE_RESIZE.
# @param oned_service
#   A service to restart when the VM_MAD entry changes (e.g. `opennebula`).
# @param manage_templates
#   Copy the source's `templates/` to `templates_dir`.
# @param templates_dir
#   Where the templates go.
# @param onehost_sync
#   Run `onehost sync --force` as oneadmin when the remotes change.
class kvm_sriov::frontend (
  Optional[Variant[Stdlib::Absolutepath, Pattern[/\Apuppet:\/\/\//]]] $source = undef,
  Optional[String[1]] $package                      = undef,
  Stdlib::Absolutepath $remotes_dir                 = '/var/lib/one/remotes',
  String[1] $owner                                  = 'oneadmin',
  String[1] $group                                  = 'oneadmin',
  Optional[Kvm_sriov::Settings] $config_settings    = undef,
  Boolean $manage_vm_mad                            = true,
  Boolean $manage_sched_mad                         = false,
  Stdlib::Absolutepath $oned_conf                   = '/etc/one/oned.conf',
  Stdlib::Absolutepath $helper_dir                  = '/usr/local/sbin',
  Stdlib::Absolutepath $snippet_file                = '/etc/one/kvm-sriov-vm_mad.conf',
  Pattern[/\A[A-Za-z0-9_-]+\z/] $mad_name           = 'kvm-sriov',
  Pattern[/\A[^"\n]+\z/] $sunstone_name             = 'KVM SR-IOV',
  Integer[1, 256] $threads                          = 15,
  Integer[0, 10] $retries                           = 0,
  Boolean $parallel                                 = true,
  Array[Pattern[/\A[a-z_]+(=[A-Za-z0-9_.\/-]+)?\z/]] $local_actions = [],
  Pattern[/\A[^"\n]+\z/] $default_conf              = 'vmm_exec/vmm_exec_kvm.conf',
  Boolean $keep_snapshots                           = true,
  Boolean $live_resize                              = true,
  Optional[String[1]] $oned_service                 = undef,
  Boolean $manage_templates                         = true,
  Stdlib::Absolutepath $templates_dir               = '/usr/share/kvm-sriov/templates',
  Boolean $onehost_sync                             = false,
) {
  kvm_sriov::remotes { 'frontend':
    remotes_dir     => $remotes_dir,
    source          => $source,
    package         => $package,
    owner           => $owner,
    group           => $group,
    config_settings => $config_settings,
  }

  # The VF-aware placement policy (`SCHED_MAD` `-p kvm-sriov`, docs/scheduling.md),
  # next to OpenNebula's own in the remotes; it imports the library installed above.
  if $source {
    file { ["${remotes_dir}/scheduler", "${remotes_dir}/scheduler/kvm-sriov"]:
      ensure  => directory,
      owner   => $owner,
      group   => $group,
      mode    => '0755',
      require => Kvm_sriov::Remotes['frontend'],
    }
    file { "${remotes_dir}/scheduler/kvm-sriov/place":
      ensure => file,
      source => "${regsubst($source, '/+\\z', '')}/sched/kvm-sriov/place",
      owner  => $owner,
      group  => $group,
      mode   => '0755',
    }
  }

  if $onehost_sync {
    exec { 'kvm_sriov-onehost-sync':
      command     => ['su', '-s', '/bin/sh', '-c', 'onehost sync --force', $owner],
      path        => ['/usr/bin', '/bin', '/usr/sbin', '/sbin'],
      refreshonly => true,
      subscribe   => Kvm_sriov::Remotes['frontend'],
    }
  }

  if $manage_templates and $source {
    file { dirname($templates_dir):
      ensure => directory,
      owner  => 'root',
      group  => 'root',
      mode   => '0755',
    }
    file { $templates_dir:
      ensure  => directory,
      owner   => 'root',
      group   => 'root',
      mode    => '0644',
      source  => "${regsubst($source, '/+\\z', '')}/templates",
      recurse => true,
      purge   => true,
      force   => true,
    }
  }

  if $manage_sched_mad and !$source {
    fail('kvm_sriov::frontend: manage_sched_mad needs source (the placer is installed from it)')
  }

  $helper = "${helper_dir}/kvm-sriov-oned-conf"
  if $manage_vm_mad or $manage_sched_mad {
    file { $helper:
      ensure => file,
      owner  => 'root',
      group  => 'root',
      mode   => '0755',
      source => 'puppet:///modules/kvm_sriov/kvm-sriov-oned-conf',
    }
  }

  if $manage_vm_mad {
    $arguments = [
      ['-t', String($threads), '-r', String($retries)],
      $local_actions.empty ? {
        true    => [],
        default => ['-l', $local_actions.join(',')],
      },
      [$mad_name],
      $parallel ? {
        true    => ['-p'],
        default => [],
      },
    ].flatten.join(' ')

    file { $snippet_file:
      ensure  => file,
      owner   => 'root',
      group   => 'root',
      mode    => '0644',
      content => epp('kvm_sriov/vm_mad.epp', {
          'name'           => $mad_name,
          'sunstone_name'  => $sunstone_name,
          'arguments'      => $arguments,
          'default'        => $default_conf,
          'type'           => 'kvm',
          'keep_snapshots' => $keep_snapshots,
          'live_resize'    => $live_resize,
      }),
    }

    # Shell strings so a noop run before the helper exists skips the check.
    exec { 'kvm_sriov-oned-vm_mad':
      command   => shell_join([$helper, 'apply', $oned_conf, $snippet_file]),
      unless    => "test ! -x ${shell_escape($helper)} || ${shell_join([$helper, 'check', $oned_conf, $snippet_file])}",
      provider  => 'shell',
      logoutput => true,
      require   => [File[$helper], File[$snippet_file]],
    }
  }

  # The scheduler's placer: kvm-sriov when asked, else back to rank if it was
  # kvm-sriov (without the helper there is nothing of ours to undo).
  $placer = "\"\$(${shell_join([$helper, 'placer', $oned_conf])})\""
  if $manage_sched_mad {
    exec { 'kvm_sriov-oned-sched_mad':
      command   => shell_join([$helper, 'set-placer', $oned_conf, 'kvm-sriov']),
      unless    => "test ! -x ${shell_escape($helper)} || test ${placer} = kvm-sriov",
      provider  => 'shell',
      logoutput => true,
      require   => [File[$helper], File["${remotes_dir}/scheduler/kvm-sriov/place"]],
    }
  } else {
    exec { 'kvm_sriov-oned-sched_mad':
      command   => shell_join([$helper, 'set-placer', $oned_conf, 'rank']),
      onlyif    => "test -x ${shell_escape($helper)} && test ${placer} = kvm-sriov",
      provider  => 'shell',
      logoutput => true,
    }
  }

  $oned_changes = $manage_vm_mad ? {
    true    => [Exec['kvm_sriov-oned-vm_mad'], Exec['kvm_sriov-oned-sched_mad']],
    default => [Exec['kvm_sriov-oned-sched_mad']],
  }
  if $oned_service {
    exec { 'kvm_sriov-oned-restart':
      command     => ['systemctl', 'try-restart', $oned_service],
      path        => ['/usr/bin', '/bin'],
      refreshonly => true,
      subscribe   => $oned_changes,
    }
  } else {
    exec { 'kvm_sriov-oned-notice':
      command     => "echo 'kvm_sriov: ${oned_conf} changed (VM_MAD ${mad_name} or SCHED_MAD placer): restart oned to load it'",
      path        => ['/usr/bin', '/bin'],
      refreshonly => true,
      logoutput   => true,
      subscribe   => $oned_changes,
    }
  }
}
