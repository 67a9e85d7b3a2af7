# @summary opensm with virtualization for InfiniBand SR-IOV VFs.
#
# Installs opensm, writes its options file (`virt_enabled`, `sm_priority`,
# `partition_config_file`, plus `options`) and, on Debian, the ports file;
# runs the service on the designated hosts only.
#
# Partitions: the file is kvm-sriov's network hook's (run by oned on the
# front-end, it renders the file from oned's networks and installs it here).
# The class creates it only when it is absent, with the driver's Default
# partition alone (`default_partition_members`), and reloads opensm then; an
# existing file is never touched (content, owner, mode) and never causes a
# reload. `create_partitions_file => false` leaves even that to something
# else.
#
# With `partitions_command` (a command that prints a complete partitions.conf
# on stdout, e.g. the driver's `kvm-sriov partitions`, the same file the hook
# writes) each run is also a full resync: the file is regenerated whenever
# the output differs, and opensm is sent SIGHUP to re-read it. The candidate
# replaces the file only after `validate_command` (the real opensm parsing it
# on a simulated fabric) accepted it: opensm falls back to its default
# partition (no isolation) on a file it cannot parse.
#
# Failover: every host in `sm_hosts` runs opensm; the first has priority 15,
# the next 14, ... (opensm's master is the highest priority), unless
# `priority` is given.
#
# Note: Debian/Ubuntu's opensm 3.3 ignores `virt_enabled` ("Unrecognized
# token"): VF virtual ports need an opensm with virtualization support
# (NVIDIA's opensm 5.x from MLNX_OFED/DOCA; set `package_name` to it).
#
# @example Two subnet managers, partitions from the driver
#   class { 'kvm_sriov::subnet_manager':
#     sm_hosts           => ['sm1.example.org', 'sm2.example.org'],
#     partitions_command => '/usr/bin/kvm-sriov partitions',
#   }
#
# @param package_name
#   The opensm package.
# @param package_ensure
#   `ensure` of that package.
# @param service_name
#   The opensm service.
# @param sm_hosts
#   Hosts (FQDN or short name) that run opensm; empty: this host runs it.
# @param priority
#   `sm_priority` (0-15); `undef`: from the position in `sm_hosts`.
# @param virt_enabled
#   `virt_enabled`: 0 off, 1 ignore virtualization, 2 enable (needed by VFs).
# @param config_file
#   opensm's options file.
# @param partitions_file
#   The partitions file (`partition_config_file`); keep it equal to the
#   driver's `[infiniband] partitions_file`.
# @param defaults_file
#   Debian's `/etc/default/opensm` (the ports opensm runs on); `false` skips it.
# @param ports
#   Port GUIDs for `PORTS`, or `['ALL']`.
# @param options
#   More opensm.conf options (key => value).
# @param create_partitions_file
#   Create the partitions file when it is absent (the driver's Default
#   partition only); `false`: the class never touches it.
# @param default_partition_members
#   Members of the Default partition (0x7fff) in that first file; keep them
#   equal to the driver's `[infiniband] default_partition_members`. `ALL` and
#   `ALL_CAS` only as limited members: VMs are never full members of it.
# @param partitions_command
#   Prints a partitions.conf on stdout (and nothing else), the file the
#   network hook writes; `undef`: the file is left to the hook.
# @param validate_command
#   Exits 0 only when opensm accepts the file named as its last argument;
#   `undef`: `partitions_command` followed by `--validate`, allowed only when
#   `partitions_command` runs the local `kvm-sriov` CLI directly (its first
#   word is `kvm-sriov` or a path ending in `/kvm-sriov`, no shell operators):
#   a wrapper (ssh, a script) may ignore `--validate`, so it needs this set.
# @param validator_packages
#   What `validate_command` needs besides opensm (ibsim and umad2sim).
# @param manage_service
#   Manage the opensm service (`false`: leave it to something else).
# @param reload_command
#   Makes a running opensm re-read the partitions file.
class kvm_sriov::subnet_manager (
  String[1] $package_name                     = 'opensm',
  String[1] $package_ensure                   = 'installed',
  String[1] $service_name                     = 'opensm',
  Array[Stdlib::Host] $sm_hosts               = [],
  Optional[Integer[0, 15]] $priority          = undef,
  Integer[0, 2] $virt_enabled                 = 2,
  Stdlib::Absolutepath $config_file           = '/etc/opensm/opensm.conf',
  Stdlib::Absolutepath $partitions_file       = '/etc/opensm/partitions.conf',
  Variant[Stdlib::Absolutepath, Boolean[false]] $defaults_file = '/etc/default/opensm',
  Array[Pattern[/\A(ALL|NONE|0x[0-9a-fA-F]{16})\z/], 1] $ports = ['ALL'],
  Hash[Pattern[/\A[a-z][a-z0-9_]*\z/], Variant[String[1], Integer, Boolean]] $options = {},
  Boolean $create_partitions_file             = true,
  Array[Pattern[/\A((SELF|ALL_SWITCHES|ALL_ROUTERS|0x[0-9a-fA-F]{1,16})(=(full|limited))?|(ALL|ALL_CAS)(=limited)?)\z/], 1]
    $default_partition_members = ['SELF=full', 'ALL_SWITCHES=full'],
  Optional[String[1]] $partitions_command     = undef,
  Optional[String[1]] $validate_command       = undef,
  Array[String[1]] $validator_packages        = ['ibsim-utils', 'libumad2sim0'],
  Boolean $manage_service                     = true,
  String[1] $reload_command                   = "systemctl kill --signal=HUP 'opensm@*.service'",
) {
  $fqdn = $facts.dig('networking', 'fqdn')
  $short = $facts.dig('networking', 'hostname')
  $index = $sm_hosts.index |$h| { $h == $fqdn or $h == $short }
  $designated = $sm_hosts.empty or $index =~ NotUndef
  $sm_priority = $priority ? {
    undef   => $sm_hosts.empty ? {
      true    => 15,
      default => max(0, 15 - pick($index, 15)),
    },
    default => $priority,
  }

  if lookup('kvm_sriov::subnet_manager::partitions', { 'default_value' => undef }) =~ NotUndef {
    fail(join([
          'kvm_sriov::subnet_manager: partitions is no longer read: kvm-sriov\'s network hook writes the partitions file',
          ' and the class only creates it when absent; set default_partition_members instead',
    ], ''))
  }

  $reserved = ['virt_enabled', 'sm_priority', 'partition_config_file']
  $clash = $options.keys.filter |$k| { $k in $reserved }
  unless $clash.empty {
    fail("kvm_sriov::subnet_manager: set ${clash.join(', ')} through the class parameters, not options")
  }

  package { $package_name:
    ensure => $package_ensure,
  }

  file { $config_file:
    ensure  => file,
    owner   => 'root',
    group   => 'root',
    mode    => '0644',
    content => epp('kvm_sriov/opensm.conf.epp', {
        'virt_enabled'    => $virt_enabled,
        'sm_priority'     => $sm_priority,
        'partitions_file' => $partitions_file,
        'options'         => $options,
    }),
    require => Package[$package_name],
  }

  if $defaults_file {
    file { $defaults_file:
      ensure  => file,
      owner   => 'root',
      group   => 'root',
      mode    => '0644',
      content => epp('kvm_sriov/opensm.default.epp', { 'ports' => $ports }),
      require => Package[$package_name],
    }
  }

  exec { 'kvm_sriov-opensm-reload':
    command     => $reload_command,
    path        => ['/usr/bin', '/bin', '/usr/sbin', '/sbin'],
    refreshonly => true,
    returns     => [0, 1], # no opensm running yet is fine
  }

  # The network hook's file: created (root, 0644) only when absent; no owner
  # or mode here, so an existing one is not touched at all.
  if $create_partitions_file {
    file { $partitions_file:
      ensure  => file,
      content => epp('kvm_sriov/partitions.conf.epp', { 'members' => $default_partition_members }),
      replace => false,
      require => Package[$package_name],
      notify  => Exec['kvm_sriov-opensm-reload'],
    }
    $partitions_file_resource = [File[$partitions_file]]
  } else {
    $partitions_file_resource = []
  }

  if $partitions_command {
    # Appending --validate checks the file only if the CLI itself gets it:
    # a wrapper may print the partitions again and exit 0.
    $words = $partitions_command.strip.split(/\s+/)
    $local_cli = ($words[0] =~ /\A(\S*\/)?kvm-sriov\z/ and 'partitions' in $words
      and $partitions_command !~ /[;&|`$(){}<>\\]|\n/)
    if $validate_command =~ Undef and !$local_cli {
      fail(join([
            "kvm_sriov::subnet_manager: partitions_command '${partitions_command}' is not the local kvm-sriov CLI",
            ' (a wrapper: ssh, a script), so "--validate" appended to it may check nothing; set validate_command,',
            " e.g. '/opt/kvm-sriov/bin/kvm-sriov partitions --validate'",
      ], ''))
    }
    ensure_packages($validator_packages)
    $validate = pick($validate_command, "${partitions_command} --validate")
    $candidate = "${partitions_file}.new"
    exec { 'kvm_sriov-partitions':
      command   => join([
          "umask 022 && ${partitions_command} > '${candidate}'",
          "test -s '${candidate}'",
          "${validate} '${candidate}'",
          "mv -f '${candidate}' '${partitions_file}' || { rm -f '${candidate}'; exit 1; }",
      ], ' && '),
      unless    => "${partitions_command} | cmp -s - '${partitions_file}'",
      path      => ['/usr/local/bin', '/usr/bin', '/bin', '/usr/local/sbin', '/usr/sbin', '/sbin'],
      provider  => 'shell',
      logoutput => 'on_failure',
      require   => $partitions_file_resource + [Package[$package_name], Package[$validator_packages]],
      notify    => Exec['kvm_sriov-opensm-reload'],
    }
  }

  if $manage_service {
    service { $service_name:
      ensure    => $designated,
      enable    => $designated,
      subscribe => [File[$config_file]] + ($defaults_file ? { false => [], default => [File[$defaults_file]] }),
      require   => $partitions_file_resource,
    }
  }
}
