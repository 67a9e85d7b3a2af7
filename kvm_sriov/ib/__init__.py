"""InfiniBand: the VFs' port and node GUIDs (set from the NIC's MAC and
network, restored when the VM lets go), partition keys for the subnet
manager, and the OpenSM configuration check.

Uses vf/, domain/ (the NIC records in the domain XML) and the foundation.
"""
