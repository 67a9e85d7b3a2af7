"""The VF core: PFs and VFs in sysfs, the pool that says which VM holds
which VF, the policy that picks one, NUMA facts, the recorded intents of
actions in flight, and what the monitor probe reports as available.

Uses only the foundation modules (kvm_sriov.errors, kvm_sriov.failpoints).
"""
