# @summary The kvm-sriov driver installed into an OpenNebula remotes tree.
#
# From a source tree (a checkout or unpacked release of this repository) it
# lays out what `rake install` does (docs/conventions.md):
#
#     <remotes_dir>/vmm/kvm-sriov/<action>              from vmm/kvm-sriov/
#     <remotes_dir>/vmm/kvm-sriov/kvm_sriov_bootstrap.py  from kvm_sriov_bootstrap.py
#     <remotes_dir>/vmm/kvm-sriov/lib/kvm_sriov/        from kvm_sriov/
#     <remotes_dir>/im/...                              from im/
#     <remotes_dir>/etc/vmm/kvm-sriov/kvm-sriov.toml    from etc/vmm/kvm-sriov/
#
# Files are copied, never purged, so OpenNebula's own remotes stay. The
# cluster-wide config is only created when missing (`replace => false`)
# unless `config_settings` is given, which renders it from those settings.
# Or, with `package`, a package that ships the same files is installed.
#
# @example
#   kvm_sriov::remotes { 'frontend':
#     remotes_dir => '/var/lib/one/remotes',
#     source      => '/opt/kvm-sriov',
#   }
#
# @param remotes_dir
#   The remotes tree (front-end `/var/lib/one/remotes`, host `/var/tmp/one`).
# @param source
#   The source tree: an absolute path or a `puppet:///` URL.
# @param package
#   A package to install instead of copying a source tree.
# @param package_ensure
#   `ensure` of that package.
# @param owner
#   Owner of the copied files.
# @param group
#   Group of the copied files.
# @param config_settings
#   Render the cluster-wide TOML from these settings instead of copying it.
define kvm_sriov::remotes (
  Stdlib::Absolutepath $remotes_dir,
  Optional[Variant[Stdlib::Absolutepath, Pattern[/\Apuppet:\/\/\//]]] $source = undef,
  Optional[String[1]] $package                 = undef,
  String[1] $package_ensure                    = 'installed',
  String[1] $owner                             = 'oneadmin',
  String[1] $group                             = 'oneadmin',
  Optional[Kvm_sriov::Settings] $config_settings = undef,
) {
  if ($source and $package) or (!$source and !$package) {
    fail("kvm_sriov::remotes '${title}': give exactly one of source and package")
  }

  if $package {
    ensure_packages([$package], { 'ensure' => $package_ensure })
  } else {
    $src = regsubst($source, '/+\z', '')
    $vmm = "${remotes_dir}/vmm/kvm-sriov"
    $etc = "${remotes_dir}/etc/vmm/kvm-sriov"
    $copy = {
      owner   => $owner,
      group   => $group,
      recurse => true,
      purge   => false,
      force   => false,
      ignore  => ['__pycache__', '*.pyc', '.git'],
    }

    # Parents OpenNebula normally creates; made only when missing.
    $parents = ["${remotes_dir}/vmm", "${remotes_dir}/im", "${remotes_dir}/etc/vmm"]
    exec { "kvm_sriov-remotes-parents-${title}":
      command => ['install', '-d', '-o', $owner, '-g', $group] + $parents,
      unless  => [['test', '-d', $parents[0]], ['test', '-d', $parents[1]], ['test', '-d', $parents[2]]],
      path    => ['/usr/bin', '/bin'],
    }

    file {
      default:
        require => Exec["kvm_sriov-remotes-parents-${title}"],
        ;
      $vmm:
        ensure => directory,
        source => "${src}/vmm/kvm-sriov",
        mode   => '0755', # actions are run directly
        *      => $copy,
        ;
      "${vmm}/kvm_sriov_bootstrap.py": # what every entry point imports first
        ensure => file,
        source => "${src}/kvm_sriov_bootstrap.py",
        owner  => $owner,
        group  => $group,
        mode   => '0644',
        ;
      "${vmm}/lib":
        ensure => directory,
        owner  => $owner,
        group  => $group,
        ;
      "${vmm}/lib/kvm_sriov":
        ensure => directory,
        source => "${src}/kvm_sriov",
        mode   => '0644',
        *      => $copy,
        ;
      "${remotes_dir}/im":
        ensure => directory,
        source => "${src}/im",
        mode   => '0755', # probes are run directly
        *      => $copy,
        ;
      $etc:
        ensure => directory,
        owner  => $owner,
        group  => $group,
        ;
    }

    if $config_settings =~ Undef {
      file { "${etc}/kvm-sriov.toml":
        ensure  => file,
        owner   => $owner,
        group   => $group,
        mode    => '0644',
        source  => "${src}/etc/vmm/kvm-sriov/kvm-sriov.toml",
        replace => false,
      }
    } else {
      file { "${etc}/kvm-sriov.toml":
        ensure  => file,
        owner   => $owner,
        group   => $group,
        mode    => '0644',
        content => epp('kvm_sriov/kvm-sriov.toml.epp', {
            'sections' => kvm_sriov::merge_settings($config_settings, {}),
            'origin'   => "kvm_sriov::remotes '${title}'",
            'layer'    => 'cluster-wide config (travels with onehost sync)',
        }),
      }
    }
  }
}
