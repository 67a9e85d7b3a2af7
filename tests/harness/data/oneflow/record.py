"""Record what OneFlow 7.4 and oned answer about services, for the harness's
unit tests (tests/harness/test_harness_service.py), and check the harness's
service target against the live servers while they run.

    /usr/bin/python3 tests/harness/data/oneflow/record.py     # from the checkout, ~4 min

A rung-4 front-end over two simulated hosts with OneFlow (as
tests/opennebula/test_oneflow.py starts it), in build/rung4-bench-record:
1. a two-role service (head + 2 workers, tiny VMs without NICs) to RUNNING:
   running-service.json (GET /service/<id>), service-pool.json (GET /service),
   running-vm-<n>.xml (one.vm.info of each VM, pyone's input);
2. the ib-mpi-cluster-spread service on hold (a VF NIC cannot run on the
   simulated hosts): ib-service.json, ib-vm-<n>.xml (IB NICs with addresses).
Only IDs, names, states and addresses of this throw-away front-end are in them.
"""
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "harness"))

from simhost.oneflow import Services  # noqa: E402
from tests.opennebula.conftest import simulated_frontend, vm_template  # noqa: E402
from tests.opennebula.test_oneflow import role_vms, service_template, wait_all_running  # noqa: E402

OUT = Path(__file__).resolve().parent


def save(name, text):
    (OUT / name).write_text(text)
    print("recorded", OUT / name, flush=True)


def vm_xml(fe, vm):
    return fe.cli("onevm", "show", "-x", vm).stdout


def main():
    fe = simulated_frontend(REPO / "build" / "rung4-bench-record")
    fe.start()
    try:
        with Services(fe) as flow:
            record(fe, flow)
    finally:
        fe.stop()


def record(fe, flow):
    node = vm_template(fe, "flow-node", fe.tiny_image("flow-tiny", "default"),
                       extra='CONTEXT = [ TOKEN = "YES" ]\n')
    template = service_template(flow, node)
    started = time.monotonic()
    service = int(flow.flow("oneflow-template", "instantiate", template).stdout.split("ID:")[1].split()[0])
    body = wait_all_running(flow, service, 3)
    print(f"RUNNING after {time.monotonic() - started:.1f} s", flush=True)
    save("running-service.json", json.dumps(flow._flow_get(f"/service/{service}"), indent=1) + "\n")
    save("service-pool.json", json.dumps(flow._flow_get("/service"), indent=1) + "\n")
    vms = [v for ids in role_vms(body).values() for v in ids]
    for vm in vms:
        save(f"running-vm-{vm}.xml", vm_xml(fe, vm))

    live_checks(fe, flow, service, vms)

    fe.create("vnet", 'NAME = "public"\nVN_MAD = "dummy"\nBRIDGE = "br-mgmt"\n'
                      'AR = [ TYPE = "IP4", IP = "192.168.60.10", SIZE = "50" ]\n')
    flow.flow(REPO / "templates" / "oneflow" / "create-ib-mpi-cluster.sh", "public")
    net_template = int(fe.xml("onevntemplate", "show", "ib-mpi-cluster-net").findtext("ID"))
    merge = {"on_hold": True,
             "roles": [{"name": "head", "template_id": node},
                       {"name": "worker", "template_id": node, "cardinality": 2}],
             "networks_values": [{"ib": {"template_id": str(net_template), "extra": 'VLAN_ID = "0x8002"'}}]}
    path = fe.workdir / "merge.json"
    path.write_text(json.dumps(merge))
    out = flow.flow("oneflow-template", "instantiate", "ib-mpi-cluster-spread", path).stdout
    ib_service = int(out.split("ID:")[1].split()[0])
    body = flow.wait_service(ib_service, "HOLD")
    save("ib-service.json", json.dumps(flow._flow_get(f"/service/{ib_service}"), indent=1) + "\n")
    for vm in [v for ids in role_vms(body).values() for v in ids]:
        save(f"ib-vm-{vm}.xml", vm_xml(fe, vm))


def live_checks(fe, flow, service, vms):
    """The harness's own client and target against the live OneFlow and oned."""
    import pyone

    from kvm_sriov_bench.errors import OrchestrationError
    from kvm_sriov_bench.oneflow import OneFlow
    from kvm_sriov_bench.opennebula import ServiceTarget
    client = OneFlow(flow.flow_endpoint, fe.session)
    assert client.service_id("two-roles") == service
    svc = client.service(service)
    assert svc.state == "RUNNING" and svc.vm_ids == vms, svc
    one = pyone.OneServer(fe.endpoint, session=fe.session)
    target = ServiceTarget(one, client, "two-roles", ib_attr=None, timeout=30, poll=1)
    try:
        target.wait_ready()
    except OrchestrationError as e:     # these tiny VMs have no NIC at all
        assert f"VM {vms[0]} has no NIC" in str(e), e
        print("live: refused as it should:", e, flush=True)
    else:
        raise AssertionError("a service without IB NICs was taken")
    bad = OneFlow(flow.flow_endpoint, "oneadmin:wrong")
    try:
        bad.service(service)
    except OrchestrationError as e:
        assert "HTTP 401" in str(e), e
        print("live: wrong password:", e, flush=True)
    else:
        raise AssertionError("a wrong password was accepted")


if __name__ == "__main__":
    main()
