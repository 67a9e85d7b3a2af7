# @summary The VF settings of one PF, as given to `kvm_sriov::host::pfs`
#   (the keys are the parameters of `kvm_sriov::pf`).
type Kvm_sriov::Pfconfig = Struct[{
  numvfs                      => Integer[0, 255],
  Optional[driver]            => Enum['mlx5', 'mlx4'],
  Optional[drivers_autoprobe] => Boolean,
  Optional[force]             => Boolean,
}]
