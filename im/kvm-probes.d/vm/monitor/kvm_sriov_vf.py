#!/usr/bin/python3 -S
# -S: no site packages needed (stdlib only), and ~20 ms faster to start.
# kvm-sriov VM probe (OpenNebula kvm IM, vm/monitor): each VM's InfiniBand
# traffic on its VFs, as IB_RX_BYTES, IB_TX_BYTES, IB_RX_PACKETS, IB_TX_PACKETS
# in the VM's monitoring (kvm_sriov/node/traffic.py, docs/monitoring.md).
# Always exits 0 and prints nothing on trouble: monitord drops the whole VM
# monitoring run, every VM's, when one of its probes fails. Trouble goes to syslog.
import sys

HERE = sys.path[0]  # this script's folder, links resolved
REMOTES = HERE.rsplit("/", 4)[0]  # remotes/im/kvm-probes.d/vm/monitor -> remotes/ (or the checkout)
# The one bootstrap: at the top of a checkout, beside the action scripts in the remotes
# (never in this folder: monitord runs what is there).
sys.path[:1] = [REMOTES, REMOTES + "/vmm/kvm-sriov"]
try:
    import kvm_sriov_bootstrap
    del sys.path[:2]
    why = kvm_sriov_bootstrap.load_library(HERE, [REMOTES + "/vmm/kvm-sriov/lib", REMOTES])
    if not why:
        from kvm_sriov.node.traffic import main
except Exception as exc:  # no library: say so, do not break monitoring
    why = f"kvm-sriov library not found next to {HERE}: {exc}"
if why:
    import syslog
    syslog.openlog("kvm-sriov", 0, syslog.LOG_DAEMON)
    syslog.syslog(syslog.LOG_WARNING, f"vm-traffic probe: {why}")
    sys.exit(0)
sys.exit(main(remotes_dir=REMOTES))
