"""Each VM's InfiniBand traffic on its VFs, as the VM monitoring probe counts
it (node/traffic.py: per VM the bytes and packets its VFs carried on this host,
totals that only grow here).

Read-only: the VMs the pool gives VFs here now (the probe's own pool read),
and their totals from the probe's state file through that module's reader.
The file also keeps VMs gone from here (up to its own bound), and the probe
rewrites it only while a VM holds VFs here, so after the last one left it
still names it: series that would never move again. So there are as many
series as VMs with VFs here, and a host without any does not read the file.
"""

from __future__ import annotations

from ..config import Config
from ..node import traffic

# node/traffic.py's ATTRIBUTES (IB_RX_BYTES, IB_TX_BYTES, IB_RX_PACKETS,
# IB_TX_PACKETS) in Prometheus' words (node exporter's receive/transmit)
COUNTERS = (("kvm_sriov_vm_ib_receive_bytes", "Bytes a VM's VFs received"),
            ("kvm_sriov_vm_ib_transmit_bytes", "Bytes a VM's VFs transmitted"),
            ("kvm_sriov_vm_ib_receive_packets", "Packets a VM's VFs received"),
            ("kvm_sriov_vm_ib_transmit_packets", "Packets a VM's VFs transmitted"))


def read(cfg: Config) -> dict[int, tuple[int, int, int, int]]:
    """VM ID -> its totals in COUNTERS' order, of the VMs holding VFs here that
    the probe has counted; {} when there are none. DriverError as the pool's
    and the state folder's readers raise it."""
    here = {h.vm_id for h in traffic.attached(cfg.pool_db)[0]}
    if not here:
        return {}
    return {vm: total for vm, total in traffic.vm_totals(cfg.state_dir).items() if vm in here}


def families(totals: dict[int, tuple[int, int, int, int]]) -> list:
    from prometheus_client.core import CounterMetricFamily
    out = []
    for i, (name, text) in enumerate(COUNTERS):
        family = CounterMetricFamily(name, f"{text} on this host, as the VM monitoring probe counts them "
                                           "(the VM's own: not a VF's earlier holders')", labels=["vm"])
        for vm, counts in sorted(totals.items()):
            family.add_metric([str(vm)], counts[i])
        out.append(family)
    return out
