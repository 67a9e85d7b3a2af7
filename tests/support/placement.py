"""Scheduler documents written by OpenNebula 7.4 (tests/sched/fixtures/, one folder
a window: input.xml, ledger.json, time.txt, plan.xml) and the placement program
(sched/kvm-sriov/place), for the placement and VM group tests."""

from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from kvm_sriov.scheduler.placement import Ledger
from kvm_sriov.scheduler.placement_program import Window
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "sched" / "fixtures"  # made by tests/sched/make_fixtures.py
WINDOWS = sorted(d.name for d in FIXTURES.iterdir() if (d / "input.xml").is_file()) if FIXTURES.is_dir() else []
PLACE = REPO / "sched" / "kvm-sriov" / "place"


def window(name: str) -> Window:
    d = FIXTURES / name
    ledger = Ledger(None)
    if (d / "ledger.json").is_file():
        ledger.loads((d / "ledger.json").read_text())
    return Window((d / "input.xml").read_bytes(), ledger, now=float((d / "time.txt").read_text()))


def requirements(doc: ET.Element) -> dict[int, list[int]]:
    return {int(r.findtext("ID")): sorted(int(h.text) for h in r.iterfind("HOSTS/ID"))
            for r in doc.iterfind("REQUIREMENTS/VM")}


def plan_actions(xml: bytes) -> dict[int, int]:
    return {int(a.findtext("VM_ID")): int(a.findtext("HOST_ID")) for a in ET.fromstring(xml).iterfind("ACTION")}


def rank_place() -> Path:
    """The prefix of the OpenNebula 7.4 install whose rank placer the program hands over to."""
    from simhost.frontend import OpenNebulaMissing, locate_install
    try:
        prefix = locate_install()
    except OpenNebulaMissing as exc:
        pytest.fail(f"the real rank placer is needed here: {exc}", pytrace=False)
    return prefix
