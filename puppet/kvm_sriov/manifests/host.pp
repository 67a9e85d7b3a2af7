# @summary A KVM host that gives VMs InfiniBand SR-IOV VFs through kvm-sriov.
#
# Turns the IOMMU on (boot loader, reboot needed), sets the VF count of each
# PF (mlx5: `sriov_numvfs` at boot and now; mlx4: modprobe options), loads
# vfio-pci, installs libvirt/QEMU and the Python the driver runs on, writes
# the host-local driver config `/etc/kvm-sriov/kvm-sriov.toml` and, when a
# source is given, puts the driver's remotes where OpenNebula runs them.
#
# Every setting of the host config is optional: unset (`undef`) keys are
# left out of the host file, so the cluster-wide
# `remotes/etc/vmm/kvm-sriov/kvm-sriov.toml` (or the built-in default) holds.
#
# @example Two ConnectX-6 PFs with 8 VFs each, driver from a checkout
#   class { 'kvm_sriov::host':
#     pfs           => {
#       '0000:03:00.0' => { 'numvfs' => 8 },
#       'mlx5_1'       => { 'numvfs' => 8 },
#     },
#     pool_pfs      => ['0000:03:00.0', 'mlx5_1'],
#     numa_policy   => 'require',
#     remotes_source => '/opt/kvm-sriov',
#   }
#
# @param manage_iommu
#   Put the IOMMU arguments on the kernel command line (GRUB).
# @param iommu_vendor
#   `intel` (`intel_iommu=on`), `amd` (`amd_iommu=on`) or `auto` (from the
#   `processors` fact: AMD when the first model names AMD, else Intel).
# @param iommu_passthrough
#   Add `iommu=pt` (host devices skip DMA translation; VFs stay isolated).
# @param extra_kernel_args
#   More `key=value` or flag arguments to put on the command line.
# @param grub_file
#   The GRUB defaults file whose `GRUB_CMDLINE_LINUX` gets the arguments.
# @param grub_update_command
#   Runs when the GRUB defaults change (Debian: `update-grub`; module data
#   holds the RedHat commands).
# @param augeas_root
#   The root augeas edits under (tests apply into a throwaway root).
# @param reboot_required_file
#   Touched when the command line changed (Debian's `/run/reboot-required`
#   convention); `false` to skip.
# @param pfs
#   PF name => VF settings; one `kvm_sriov::pf` each.
# @param sysfs_root
#   Where sysfs is mounted (tests point this at a fake tree).
# @param helper_dir
#   Where the VF helper script is installed.
# @param vfs_config_dir
#   One file per mlx5 PF read by `kvm-sriov-vfs.service` at boot.
# @param systemd_dir
#   Where the boot unit is installed.
# @param mlx4_port_type_array
#   mlx4_core `port_type_array` written with the mlx4 VF options (`1` = IB);
#   `false` leaves it out.
# @param manage_vfio
#   Load vfio-pci now and at every boot.
# @param vfio_modules
#   The modules to load (names as in /sys/module).
# @param modprobe_dir
#   Where the mlx4 modprobe options file goes.
# @param modules_load_dir
#   Where the vfio modules-load.d file goes.
# @param manage_libvirt
#   Install libvirt/QEMU and the Python packages the driver needs, run libvirtd.
# @param libvirt_packages
#   libvirt and QEMU packages (module data per OS family).
# @param python_packages
#   Python packages the host driver imports (docs/conventions.md).
# @param libvirt_service
#   The libvirt daemon service.
# @param manage_libvirt_service
#   Keep the libvirt service running and enabled.
# @param vfio_udev_rule
#   Write a udev rule giving `/dev/vfio/*` to `vfio_group` (needed when QEMU
#   runs as oneadmin with `dynamic_ownership = 0`, as OpenNebula sets it).
# @param vfio_group
#   Group of `/dev/vfio/*` nodes.
# @param vfio_mode
#   Mode of `/dev/vfio/*` nodes.
# @param udev_rules_dir
#   Where the udev rule goes.
# @param config_file
#   The host-local driver config (docs/conventions.md, layer 3).
# @param config_owner
#   Owner of the config file.
# @param config_group
#   Group of the config file (oneadmin must read it).
# @param pool_pfs
#   `[pool] pfs`: the PFs that feed the pool; `[]` = every InfiniBand SR-IOV PF.
# @param skip_vfs_in_host_use
#   `[pool] skip_vfs_in_host_use`.
# @param state_dir
#   `[pool] state_dir`.
# @param reservation_grace_seconds
#   `[pool] reservation_grace_seconds`.
# @param numa_policy
#   `[pool] numa_policy`.
# @param bridge
#   `[network] bridge`: the marker bridge name of SR-IOV NICs.
# @param libvirt_uri
#   `[libvirt] uri`.
# @param shutdown_seconds
#   `[timeouts] shutdown_seconds`.
# @param lock_seconds
#   `[timeouts] lock_seconds`.
# @param guid_policy
#   `[infiniband] guid_policy`.
# @param partitions_file
#   `[infiniband] partitions_file`.
# @param settings
#   Any other keys by section; the typed parameters above win.
# @param manage_state_dir
#   Create `state_dir` (when set) owned by `remotes_owner`.
# @param shm_size
#   Size of /dev/shm (tmpfs `size=`: bytes with k/m/g, or a percentage of
#   RAM like `75%`), where shared-memory regions between VMs live;
#   `undef` leaves /dev/shm as the distribution mounts it (half the RAM).
# @param fstab_file
#   The fstab that gets the /dev/shm line.
# @param shm_remount_command
#   Runs when the /dev/shm line changed; `undef`: remount /dev/shm with
#   the new size now.
# @param remotes_source
#   A directory holding the kvm-sriov source tree (a checkout or an unpacked
#   release, local path or `puppet:///` URL) to install the remotes from.
# @param remotes_package
#   Or a package that installs them. Neither: leave the remotes to
#   `onehost sync` from the front-end.
# @param remotes_dir
#   Where OpenNebula runs remotes on a host.
# @param remotes_owner
#   Owner of the installed remotes.
# @param remotes_group
#   Group of the installed remotes.
class kvm_sriov::host (
  Boolean $manage_iommu                              = true,
  Enum['auto', 'intel', 'amd'] $iommu_vendor         = 'auto',
  Boolean $iommu_passthrough                         = true,
  Array[Pattern[/\A[^\s"'=]+(=[^\s"']+)?\z/]] $extra_kernel_args = [],
  Stdlib::Absolutepath $grub_file                    = '/etc/default/grub',
  String[1] $grub_update_command                     = '/usr/sbin/update-grub',
  Stdlib::Absolutepath $augeas_root                  = '/',
  Variant[Stdlib::Absolutepath, Boolean[false]] $reboot_required_file = '/run/reboot-required',
  Hash[Kvm_sriov::Pfname, Kvm_sriov::Pfconfig] $pfs  = {},
  Stdlib::Absolutepath $sysfs_root                   = '/sys',
  Stdlib::Absolutepath $helper_dir                   = '/usr/local/sbin',
  Stdlib::Absolutepath $vfs_config_dir               = '/etc/kvm-sriov/vfs.d',
  Stdlib::Absolutepath $systemd_dir                  = '/etc/systemd/system',
  Variant[Pattern[/\A[1-4](,[1-4])?\z/], Boolean[false]] $mlx4_port_type_array = '1,1',
  Boolean $manage_vfio                               = true,
  Array[Pattern[/\A[a-z0-9_]+\z/], 1] $vfio_modules  = ['vfio', 'vfio_iommu_type1', 'vfio_pci'],
  Stdlib::Absolutepath $modprobe_dir                 = '/etc/modprobe.d',
  Stdlib::Absolutepath $modules_load_dir             = '/etc/modules-load.d',
  Boolean $manage_libvirt                            = true,
  Array[String[1]] $libvirt_packages                 = ['libvirt-daemon-system', 'qemu-system-x86'],
  Array[String[1]] $python_packages                  = ['python3-libvirt'],
  String[1] $libvirt_service                         = 'libvirtd',
  Boolean $manage_libvirt_service                    = true,
  Boolean $vfio_udev_rule                            = true,
  String[1] $vfio_group                              = 'kvm',
  Pattern[/\A0?[0-7]{3}\z/] $vfio_mode               = '0660',
  Stdlib::Absolutepath $udev_rules_dir               = '/etc/udev/rules.d',
  Stdlib::Absolutepath $config_file                  = '/etc/kvm-sriov/kvm-sriov.toml',
  String[1] $config_owner                            = 'root',
  String[1] $config_group                            = 'root',
  Optional[Array[Kvm_sriov::Pfname]] $pool_pfs       = undef,
  Optional[Boolean] $skip_vfs_in_host_use            = undef,
  Optional[Stdlib::Absolutepath] $state_dir          = undef,
  Optional[Integer[0]] $reservation_grace_seconds    = undef,
  Optional[Enum['prefer', 'require', 'ignore']] $numa_policy = undef,
  Optional[Pattern[/\A[A-Za-z0-9_.-]+\z/]] $bridge   = undef,
  Optional[String[1]] $libvirt_uri                   = undef,
  Optional[Integer[1]] $shutdown_seconds             = undef,
  Optional[Integer[1]] $lock_seconds                 = undef,
  Optional[Enum['mac']] $guid_policy                 = undef,
  Optional[Stdlib::Absolutepath] $partitions_file    = undef,
  Kvm_sriov::Settings $settings                      = {},
  Boolean $manage_state_dir                          = true,
  Optional[Pattern[/\A[1-9][0-9]*([kKmMgG]|%)?\z/]] $shm_size = undef,
  Stdlib::Absolutepath $fstab_file                   = '/etc/fstab',
  Optional[String[1]] $shm_remount_command           = undef,
  Optional[String[1]] $remotes_source                = undef,
  Optional[String[1]] $remotes_package               = undef,
  Stdlib::Absolutepath $remotes_dir                  = '/var/tmp/one',
  String[1] $remotes_owner                           = 'oneadmin',
  String[1] $remotes_group                           = 'oneadmin',
) {
  contain kvm_sriov::host::iommu
  contain kvm_sriov::host::vfio
  contain kvm_sriov::host::vfs
  contain kvm_sriov::host::libvirt
  contain kvm_sriov::host::config
  contain kvm_sriov::host::shm

  # The config folder holds the VF files; VFs exist before libvirt (and so
  # before any VM) starts.
  Class['kvm_sriov::host::config']
  -> Class['kvm_sriov::host::vfio']
  -> Class['kvm_sriov::host::vfs']
  -> Kvm_sriov::Pf <| |>
  -> Class['kvm_sriov::host::libvirt']

  $pfs.each |$pf, $cfg| {
    kvm_sriov::pf { $pf:
      * => $cfg,
    }
  }

  if $remotes_source or $remotes_package {
    kvm_sriov::remotes { 'host':
      remotes_dir => $remotes_dir,
      source      => $remotes_source,
      package     => $remotes_package,
      owner       => $remotes_owner,
      group       => $remotes_group,
    }
  }
}
