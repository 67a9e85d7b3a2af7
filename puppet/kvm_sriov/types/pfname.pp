# @summary A PF name: PCI address, IB device (`mlx5_0`) or netdev (`ib0`).
#
# As docs/conventions.md names PFs in `pool.pfs`: a PCI address
# (`0000:03:00.0` or `03:00.0`), an IB device or a PF netdev.
type Kvm_sriov::Pfname = Variant[
  Kvm_sriov::Pciaddress,
  Pattern[/\A[a-zA-Z][a-zA-Z0-9_.-]{0,14}\z/],
]
