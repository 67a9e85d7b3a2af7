"""The partition manager that makes the fabric enforce kvm-sriov's partitions
(fabric/manager.py), e.g. opensm on every SM node."""
