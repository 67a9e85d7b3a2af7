"""kvm-sriov-bench: measures how close VMs with SR-IOV InfiniBand VFs come to
bare metal (efficiency = VM/native, or native/VM for latency)."""
__version__ = "0.1.0"
