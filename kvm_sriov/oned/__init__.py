"""What OpenNebula hands the driver, read: the action XML and the VM
template, the stock vmm_exec_kvm.conf defaults with kvm-sriov's values, and
the OpenNebula version.

Uses domain/ (the domain XML, the NIC records), kvm_sriov.opennebula and the
foundation.
"""
