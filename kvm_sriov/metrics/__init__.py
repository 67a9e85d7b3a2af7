"""Prometheus metrics of what the driver does, for node exporter's textfile
collector (docs/metrics.md): ``kvm-sriov metrics --textfile-dir DIR`` writes
``DIR/kvm_sriov.prom`` with this host's figures (host.py) and, where the
network hook runs, the front-end's (frontend.py); the VMs' last migration
outages from this host (outage.py) and their InfiniBand traffic (traffic.py).

Nothing of the action path imports this package: the figures are read from
what the actions and probes leave (the pool, the hook's status file, the
migration outage records, the VM traffic probe's state), read-only, by a
timer. python3-prometheus-client is imported only here, when metrics are made.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from .. import __version__
from ..config import Config
from ..errors import DriverError
from . import frontend, host, outage, traffic

TEXTFILE = "kvm_sriov.prom"
MISSING = "missing python3-prometheus-client: apt-get install python3-prometheus-client"


class _Families:
    """A collector that gives the families it was made with."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):
        return iter(self.families)


def _client():
    try:
        import prometheus_client
    except ImportError:
        raise DriverError(MISSING) from None
    return prometheus_client


def registry(cfg: Config, hypervisor=None):
    """A CollectorRegistry holding every figure, read now."""
    client = _client()
    from prometheus_client.core import InfoMetricFamily
    families = [InfoMetricFamily("kvm_sriov_build", "The kvm-sriov library that made these metrics",
                                 value={"version": __version__})]
    families += host.families(host.read(cfg, hypervisor))
    families += outage.families(outage.read(cfg))
    families += traffic.families(traffic.read(cfg))
    status = frontend.read(cfg)
    if status is not None:
        families += frontend.families(status)
    collected = client.CollectorRegistry(auto_describe=False)
    collected.register(_Families(families))
    return collected


def write_textfile(cfg: Config, directory, hypervisor=None) -> Path:
    """``directory/kvm_sriov.prom`` replaced whole (write_to_textfile: a
    temporary file renamed over it, so node exporter never reads half of it)."""
    client = _client()
    made = registry(cfg, hypervisor)
    path = Path(directory) / TEXTFILE
    # node exporter runs as another user (prometheus): the file is for it to read,
    # whatever umask the caller has (the figures are counts and region names)
    umask = os.umask(0o022)
    try:
        client.write_to_textfile(str(path), made)
    except OSError as exc:
        # its temporary file (<path>.<pid>.<thread>) stays behind when the write fails
        for stray in glob.glob(f"{glob.escape(str(path))}.{os.getpid()}.*"):
            try:
                os.unlink(stray)
            except OSError:
                pass
        raise DriverError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        os.umask(umask)
    return path
