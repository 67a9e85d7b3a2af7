"""IVShmem: a shared-memory region per (owner, VM group), shown to the
group's VMs on a host as an ivshmem-plain device. device: the request and
the domain XML; region: the files; table: who uses which region; host: the
actions' join, leave, plug, unplug and reconcile.

Uses domain/, vf/ and the foundation.
"""
