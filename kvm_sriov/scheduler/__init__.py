"""The placer oned's scheduler runs (sched/kvm-sriov/place): which host can
give a VM its VFs (and shared-memory region), from the monitor's figures.

Uses oned/, ivshmem/, domain/, vf/ and the foundation.
"""
