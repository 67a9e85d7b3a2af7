# @summary A physical function as docs/conventions.md names it in `pool.pfs`:
#   a PCI address (`0000:03:00.0` or `03:00.0`), an IB device (`mlx5_0`)
#   or a PF netdev (`ib0`).
type Kvm_sriov::Pfname = Variant[
  Kvm_sriov::Pciaddress,
  Pattern[/\A[a-zA-Z][a-zA-Z0-9_.-]{0,14}\z/],
]
