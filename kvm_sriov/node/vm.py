"""One VM's domain and devices on this host, as several actions use them."""

from __future__ import annotations


def destroy_if_running(host, name: str) -> None:
    """No half-started domain: a stock deploy or restore that failed after
    starting the domain (killed, say) must not leave it running with VFs the
    pool is about to free. An undo step: the undo stack logs its error."""
    dom = host.hypervisor.lookup(name)
    if dom is not None and host.hypervisor.is_active(dom):
        host.hypervisor.destroy(dom)
