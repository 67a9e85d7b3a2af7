#!/usr/bin/python3 -S
# -S: no site packages needed (stdlib only), and ~20 ms faster to start.
# kvm-sriov host probe (OpenNebula kvm IM, system category): InfiniBand VF
# totals and free counts per PF and NUMA node, IB link state. Always exits 0.
# os.path, not pathlib: the probe's start is most of its time (kvm_sriov/oned/probe.py).
import os
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
REMOTES = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
# remotes/im/kvm-probes.d/host/system -> remotes/ (or the checkout)
for candidate in (os.path.join(REMOTES, "vmm", "kvm-sriov", "lib"), REMOTES):
    if os.path.isfile(os.path.join(candidate, "kvm_sriov", "__init__.py")):
        sys.path.insert(0, candidate)
        break
try:
    from kvm_sriov.oned.probe import main
except Exception as exc:  # no library: say so, do not break monitoring
    print(f'KVM_SRIOV_ERROR = "kvm-sriov library not found next to {HERE}: {exc}"')
    sys.exit(0)
sys.exit(main(remotes_dir=REMOTES))
