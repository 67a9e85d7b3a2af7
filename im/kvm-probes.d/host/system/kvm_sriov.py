#!/usr/bin/python3 -S
# -S: no site packages needed (stdlib only), and ~20 ms faster to start.
# kvm-sriov host probe (OpenNebula kvm IM, system category): InfiniBand VF
# totals and free counts per PF and NUMA node, IB link state. Always exits 0:
# a library it cannot use is a KVM_SRIOV_ERROR line, monitoring goes on.
# os.path, not pathlib: the probe's start is most of its time (kvm_sriov/node/probe.py).
import sys

HERE = sys.path[0]  # this script's folder, links resolved
REMOTES = HERE.rsplit("/", 4)[0]  # remotes/im/kvm-probes.d/host/system -> remotes/ (or the checkout)
# The one bootstrap: at the top of a checkout, beside the action scripts in the remotes
# (never in this folder: monitord runs what is there).
sys.path[:1] = [REMOTES, REMOTES + "/vmm/kvm-sriov"]
try:
    import kvm_sriov_bootstrap
    del sys.path[:2]
    why = kvm_sriov_bootstrap.load_library(HERE, [REMOTES + "/vmm/kvm-sriov/lib", REMOTES])
    if not why:
        from kvm_sriov.node.probe import main
except Exception as exc:  # no library: say so, do not break monitoring
    why = f"kvm-sriov library not found next to {HERE}: {exc}"
if why:
    why = why.replace("\\", "\\\\").replace('"', '\\"')
    print(f'KVM_SRIOV_ERROR = "kvm-sriov probe: {why}"')
    sys.exit(0)
sys.exit(main(remotes_dir=REMOTES))
