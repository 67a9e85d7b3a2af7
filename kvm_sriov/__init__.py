"""kvm-sriov: InfiniBand SR-IOV Virtual Functions for OpenNebula KVM VMs."""

__version__ = "0.1.0"
