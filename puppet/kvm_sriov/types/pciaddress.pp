# @summary A PCI address with or without its domain: `0000:03:00.0`, `03:00.0`.
type Kvm_sriov::Pciaddress = Pattern[/\A(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-1][0-9a-fA-F]\.[0-7]\z/]
