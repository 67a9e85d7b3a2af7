"""This host as the actions see it: Host ties the pool, the inventory,
libvirt and the GUIDs together under one lock and reconciles them; the
migration peer (the destination, seen from the source); the doctor checks;
what this host tells OpenNebula's monitoring: the probe (VF counts) and the
signal that has it rerun after a pool change (monitor).

Uses every package below it (scheduler/ aside) and never actions/.
"""
