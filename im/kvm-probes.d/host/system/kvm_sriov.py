#!/usr/bin/python3 -S
# -S: no site packages needed (stdlib only), and ~20 ms faster to start.
# kvm-sriov host probe (OpenNebula kvm IM, system category): InfiniBand VF
# totals and free counts per PF and NUMA node, IB link state. Always exits 0.
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REMOTES = HERE.parents[3]  # remotes/im/kvm-probes.d/host/system -> remotes/ (or the checkout)
for candidate in (REMOTES / "vmm" / "kvm-sriov" / "lib", REMOTES):
    if (candidate / "kvm_sriov" / "__init__.py").is_file():
        sys.path.insert(0, str(candidate))
        break
try:
    from kvm_sriov.oned.probe import main
except Exception as exc:  # no library: say so, do not break monitoring
    print(f'KVM_SRIOV_ERROR = "kvm-sriov library not found next to {HERE}: {exc}"')
    sys.exit(0)
sys.exit(main(remotes_dir=REMOTES))
