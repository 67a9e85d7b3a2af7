# @summary The OpenNebula front-end side of kvm-sriov.
#
# Installs the driver into the remotes (`vmm/kvm-sriov`, its library,
# the `im/` probes, the cluster-wide config), registers the `VM_MAD` in
# oned.conf and writes its defaults file `vmm_exec/vmm_exec_kvm-sriov.conf`
# by the very command operators and the Ansible role run (`kvm-sriov
# setup-frontend`, from the installed library: same markers, same files),
# and puts the VM and network templates where admins can `onetemplate
# create`/`onevnet create` them. With `manage_sched_mad` the registration
# also selects the VF-aware placer in oned.conf's `SCHED_MAD`
# (docs/scheduling.md). oned reads oned.conf at start only: give
# `oned_service` to have it restarted on a change, else a notice says so.
# Hosts get the remotes with `onehost sync` (or `onehost_sync => true`).
# The oned.conf block also makes a network's `VLAN_ID` (its IB partition
# key) an attribute only oneadmin's group can write (`VNET_RESTRICTED_ATTR`).
# With `manage_hooks` it then registers the network hooks as oneadmin
# (`kvm-sriov setup-hooks`: the subnet manager follows the IB networks, and
# `KVM_SRIOV_PKEY = "AUTO"` networks get a key, docs/infiniband.md 2.1),
# once oned answers.
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
#   Keep the VM_MAD entry in oned.conf and its defaults file (`kvm-sriov
#   setup-frontend`).
# @param manage_sched_mad
#   Select the kvm-sriov placer in oned.conf (`SCHED_MAD` `ARGUMENTS`
#   `-p kvm-sriov`, the rest of the line kept) with the registration.
#   `false` is the way back: a placer this registration selected is put
#   back as it was (the registration's block records it). Needs
#   `manage_vm_mad`.
# @param oned_conf
#   oned's configuration file.
# @param snippet_file
#   The rendered VM_MAD entry the registration puts into oned.conf.
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
#   DEFAULT: the driver defaults file, relative to /etc/one (the
#   registration writes `vmm_exec/vmm_exec_kvm-sriov.conf`).
# @param keep_snapshots
#   KEEP_SNAPSHOTS.
# @param live_resize
#   LIVE_RESIZE.
# @param oned_service
#   A service to restart when the VM_MAD entry changes (e.g. `opennebula`).
# @param manage_templates
#   Copy the source's `templates/` to `templates_dir`.
# @param templates_dir
#   Where the templates go (the registration reads `oned/` there: with
#   `package`, the package's).
# @param onehost_sync
#   Run `onehost sync --force` as oneadmin when the remotes change.
# @param manage_hooks
#   Register the network hooks in oned (`kvm-sriov setup-hooks`, run as
#   `hooks_user` with `one_auth`), idempotent: nothing is done when every
#   hook is as it should be. With `oned_service`, only while that service is
#   active and after its restart; a registration that finds no oned answering
#   within about a minute fails with the reason. `false` leaves the hooks alone.
# @param hooks_user
#   The account the registration runs as (oned's hooks run as oned's user).
# @param one_auth
#   That account's OpenNebula credentials file (`ONE_AUTH`).
# @param one_xmlrpc
#   oned's XML-RPC endpoint (`ONE_XMLRPC`); default: OpenNebula's own
#   default, `http://localhost:2633/RPC2`.
# @param hooks_command
#   The hooks' `COMMAND`: a kvm-sriov CLI and `network-hook`. Default: the
#   source tree's `bin/kvm-sriov` when `source` is a local path, else the one
#   of the opennebula-kvm-sriov-tools package
#   (`/usr/lib/kvm-sriov/bin/kvm-sriov`), as `kvm-sriov setup-hooks` run
#   from either would register.
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
  Stdlib::Absolutepath $snippet_file                = '/etc/one/kvm-sriov-vm_mad.conf',
  Pattern[/\A[A-Za-z0-9_-]+\z/] $mad_name           = 'kvm-sriov',
  Pattern[/\A[^"\n]+\z/] $sunstone_name             = 'KVM SR-IOV',
  Integer[1, 256] $threads                          = 15,
  Integer[0, 10] $retries                           = 0,
  Boolean $parallel                                 = true,
  Array[Pattern[/\A[a-z_]+(=[A-Za-z0-9_.\/-]+)?\z/]] $local_actions = [],
  Pattern[/\A[^"\n]+\z/] $default_conf              = 'vmm_exec/vmm_exec_kvm-sriov.conf',
  Boolean $keep_snapshots                           = true,
  Boolean $live_resize                              = true,
  Optional[String[1]] $oned_service                 = undef,
  Boolean $manage_templates                         = true,
  Stdlib::Absolutepath $templates_dir               = '/usr/share/kvm-sriov/templates',
  Boolean $onehost_sync                             = false,
  Boolean $manage_hooks                             = true,
  String[1] $hooks_user                             = 'oneadmin',
  Stdlib::Absolutepath $one_auth                    = '/var/lib/one/.one/one_auth',
  Optional[Stdlib::HTTPUrl] $one_xmlrpc             = undef,
  Optional[Pattern[/\A\/[^\n"]+\z/]] $hooks_command = undef,
) {
  # the library `rake install` or the package put into the remotes
  $library = "${remotes_dir}/vmm/kvm-sriov/lib"

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

  if $manage_sched_mad and !$manage_vm_mad {
    fail('kvm_sriov::frontend: manage_sched_mad needs manage_vm_mad (the registration selects the placer)')
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

    # `kvm-sriov setup-frontend` from the library just installed into the
    # remotes; its `check` says whether it would change anything. A shell
    # string, so a noop run before the library exists skips the check.
    $setup = ['/usr/bin/python3', '-m', 'kvm_sriov.frontend.oned_conf']
    $options = [
      '--oned-conf', $oned_conf, '--templates', $templates_dir, '--remotes', $remotes_dir, '--vm-mad', $snippet_file,
      ] + ($manage_sched_mad ? {
        true    => [],
        default => ['--no-placer'],
    })
    $placer = $source ? {
      undef   => [],
      default => [File["${remotes_dir}/scheduler/kvm-sriov/place"]],
    }
    $templates = ($manage_templates and $source) ? {
      true    => [File[$templates_dir]],
      default => [],
    }
    exec { 'kvm_sriov-oned-setup':
      command     => shell_join($setup + ['setup'] + $options),
      unless      => "test ! -d ${shell_escape("${library}/kvm_sriov")} || ${shell_join($setup + ['check'] + $options)}",
      environment => ["PYTHONPATH=${library}"],
      provider    => 'shell',
      logoutput   => true,
      require     => [Kvm_sriov::Remotes['frontend'], File[$snippet_file]] + $placer + $templates,
    }
  }

  if $manage_vm_mad and $oned_service {
    exec { 'kvm_sriov-oned-restart':
      command     => ['systemctl', 'try-restart', $oned_service],
      path        => ['/usr/bin', '/bin'],
      refreshonly => true,
      subscribe   => Exec['kvm_sriov-oned-setup'],
    }
  } elsif $manage_vm_mad {
    exec { 'kvm_sriov-oned-notice':
      command     => "echo 'kvm_sriov: ${oned_conf} changed (VM_MAD ${mad_name} or SCHED_MAD placer): restart oned to load it'",
      path        => ['/usr/bin', '/bin'],
      refreshonly => true,
      logoutput   => true,
      subscribe   => Exec['kvm_sriov-oned-setup'],
    }
  }

  if $manage_hooks {
    $command = $hooks_command ? {
      undef   => ($source =~ Stdlib::Absolutepath) ? {
        true    => "${regsubst($source, '/+\\z', '')}/bin/kvm-sriov network-hook",
        default => '/usr/lib/kvm-sriov/bin/kvm-sriov network-hook',
      },
      default => $hooks_command,
    }
    $hooks = ['/usr/bin/python3', '-m', 'kvm_sriov.frontend.network_hook']
    $hook_options = ['--command', $command] + ($one_xmlrpc ? {
        undef   => [],
        default => ['--endpoint', $one_xmlrpc],
    })
    # after setup-frontend (and the restart that loads it), only while oned runs;
    # oned opens its API some seconds after it starts: the setup is tried again
    $after = ($manage_vm_mad and $oned_service) ? {
      true    => [Exec['kvm_sriov-oned-restart']],
      default => $manage_vm_mad ? {
        true    => [Exec['kvm_sriov-oned-setup']],
        default => [],
      },
    }
    $running = $oned_service ? {
      undef   => undef,
      default => "systemctl is-active --quiet ${shell_escape($oned_service)}",
    }
    exec { 'kvm_sriov-setup-hooks':
      command     => shell_join($hooks + ['setup'] + $hook_options),
      unless      => "test ! -d ${shell_escape("${library}/kvm_sriov")} || ${shell_join($hooks + ['check'] + $hook_options)}",
      onlyif      => $running,
      environment => ["PYTHONPATH=${library}", "ONE_AUTH=${one_auth}"],
      user        => $hooks_user,
      cwd         => '/',
      path        => ['/usr/bin', '/bin', '/usr/sbin', '/sbin'],
      provider    => 'shell',
      tries       => 20,
      try_sleep   => 3,
      logoutput   => true,
      require     => [Kvm_sriov::Remotes['frontend']] + $after,
    }
    if $oned_service {
      Service <| title == $oned_service |> -> Exec['kvm_sriov-setup-hooks']
    }
  }
}
