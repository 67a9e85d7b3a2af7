"""libvirt: the domain XML (SR-IOV NICs become hostdevs, our records in
the metadata, the HPC profile's pinning), the hypervisor connection and
hot-plug of VFs into running domains.

Uses vf/ and the foundation (kvm_sriov.opennebula for log lines).
"""
