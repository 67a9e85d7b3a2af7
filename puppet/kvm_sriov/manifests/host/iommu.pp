# @summary IOMMU arguments on the kernel command line through GRUB.
#
# Edits `GRUB_CMDLINE_LINUX` in the GRUB defaults file with augeas
# (`Shellvars_list` lens: one node per word, so the site's other arguments
# stay). A conflicting value of the same key (`intel_iommu=off`) is
# replaced. On a change the boot loader config is regenerated and the host
# is flagged for a reboot: the running kernel keeps its IOMMU state until then.
#
# @api private
class kvm_sriov::host::iommu {
  assert_private()


  if $kvm_sriov::host::manage_iommu {
    $vendor = $kvm_sriov::host::iommu_vendor ? {
      'auto'  => ($facts.dig('processors', 'models', 0) =~ /AMD/) ? {
        true    => 'amd',
        default => 'intel',
      },
      default => $kvm_sriov::host::iommu_vendor,
    }
    $args = ["${vendor}_iommu=on"] + ($kvm_sriov::host::iommu_passthrough ? {
        true    => ['iommu=pt'],
        default => [],
    }) + $kvm_sriov::host::extra_kernel_args

    $var = 'GRUB_CMDLINE_LINUX'
    $changes = $args.map |$arg| {
      $key = regsubst($arg, '=.*\z', '')
      $rm = $arg ? {
        /=/     => ["rm ${var}/value[. =~ regexp('${regexpescape($key)}=.*')][. != '${arg}']"],
        default => [],
      }
      $rm + ["set ${var}/value[. = '${arg}'] '${arg}'"]
    }.flatten

    # A missing variable gets created with double quotes first.
    augeas { 'kvm_sriov-grub-cmdline-var':
      incl    => $kvm_sriov::host::grub_file,
      lens    => 'Shellvars_list.lns',
      root    => $kvm_sriov::host::augeas_root,
      changes => ["set ${var}/quote '\"'"],
      onlyif  => "match ${var} size == 0",
    }
    -> augeas { 'kvm_sriov-grub-cmdline':
      incl    => $kvm_sriov::host::grub_file,
      lens    => 'Shellvars_list.lns',
      root    => $kvm_sriov::host::augeas_root,
      changes => $changes,
      notify  => Exec['kvm_sriov-update-grub'],
    }

    exec { 'kvm_sriov-update-grub':
      command     => $kvm_sriov::host::grub_update_command,
      path        => ['/usr/sbin', '/usr/bin', '/sbin', '/bin'],
      refreshonly => true,
      logoutput   => true,
    }

    $flag = $kvm_sriov::host::reboot_required_file ? {
      false   => '',
      default => " && touch '${kvm_sriov::host::reboot_required_file}'",
    }
    exec { 'kvm_sriov-reboot-notice':
      command     => "echo 'kvm_sriov: kernel command line now has ${args.join(' ')}: reboot to enable the IOMMU'${flag}",
      path        => ['/usr/bin', '/bin'],
      refreshonly => true,
      logoutput   => true,
      subscribe   => Exec['kvm_sriov-update-grub'],
    }
  }
}
