"""What runs on the front-end, beside oned: the registration of the driver
and its placer in oned.conf and its removal guard (oned_conf: ``kvm-sriov
setup-frontend``), and oned's network hooks that give networks a PKey and
keep the subnet manager's partitions in step (network_hook: ``kvm-sriov
network-hook`` and ``setup-hooks``).

Uses oned/ (the vmm_exec defaults, the OpenNebula version), ib/ (PKeys,
partitions), domain/ (the domain XML), vf/ (the state folder) and the
foundation.
"""
