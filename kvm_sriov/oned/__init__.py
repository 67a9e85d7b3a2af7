"""What OpenNebula hands the driver and how oned is set up for it: the
action XML and the VM template, oned.conf and the stock vmm_exec_kvm.conf
defaults, the OpenNebula version, the monitor probe and its refresh signal.

Uses ivshmem/ (region budget), domain/, vf/, kvm_sriov.config and the foundation.
"""
