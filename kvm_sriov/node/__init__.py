"""This host as the actions see it: Host ties the pool, the inventory,
libvirt and the GUIDs together under one lock and reconciles them; the
migration peer (the destination, seen from the source); the doctor checks.

Uses every package below it (scheduler/ aside) and never actions/.
"""
