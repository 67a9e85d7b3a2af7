"""A stand-in OpenNebula front-end (oned) speaking XML-RPC at /RPC2, for
tests and dry runs where no OpenNebula runs.

It implements the ``one.*`` calls the harness makes through pyone, with
OpenNebula's response shape ``[success, result-or-message, error-code]``
and real-shaped ``<VM>``/``<HOST_POOL>``/``<VMTEMPLATE>`` XML. VMs walk
OpenNebula's state machine one step per ``one.vm.info`` call:

    instantiate (hold) -> HOLD(2)
    deploy            -> ACTIVE(3)/PROLOG(1) -> ACTIVE/BOOT(2) -> ACTIVE/RUNNING(3)
    terminate         -> ACTIVE/SHUTDOWN(12) -> DONE(6)   (refused in PROLOG/BOOT, as oned does)
    recover --delete  -> DONE(6) from any state

Where a real oned can run, tests use it (tests/opennebula/test_harness_oned.py);
the stand-in stays for the harness suite's dry runs, which must not need an
OpenNebula build.

Once RUNNING, the guest "reports" its InfiniBand port up after
``ib_delay`` more polls by setting ``IB_STATE="ACTIVE"`` in its
USER_TEMPLATE, the way the guest scripts report through OneGate.
NICs on a network whose BRIDGE is ``ib-sriov`` (the project's marker) get
an IPoIB address from 10.10.0.0/16; the others from 192.168.150.0/24.
"""
from __future__ import annotations

import threading
import time
from xml.sax.saxutils import escape
from xmlrpc.server import SimpleXMLRPCRequestHandler, SimpleXMLRPCServer

# OpenNebula error codes
AUTHENTICATION, AUTHORIZATION, NO_EXISTS, ACTION, XML_RPC_API, INTERNAL = (
    0x0100, 0x0200, 0x0400, 0x0800, 0x1000, 0x2000)

VM_INIT, VM_PENDING, VM_HOLD, VM_ACTIVE, VM_DONE = 0, 1, 2, 3, 6
LCM_INIT, LCM_PROLOG, LCM_BOOT, LCM_RUNNING, LCM_SHUTDOWN = 0, 1, 2, 3, 12
USER_ATTRIBUTES = ("SERVICE_ID", "ROLE_NAME")
LCM_NAMES = {LCM_INIT: "LCM_INIT", LCM_PROLOG: "PROLOG", LCM_BOOT: "BOOT", LCM_RUNNING: "RUNNING",
             LCM_SHUTDOWN: "SHUTDOWN"}


def _parse_template(text):
    """OpenNebula template syntax (KEY = "v", KEY = [ A = "x", B = "y" ]) ->
    list of (key, value-or-dict)."""
    n = len(text)

    def skip_ws(i):
        while i < n and text[i] in " \t\r\n,":
            i += 1
        return i

    def read_value(i):
        if text[i] == '"':
            j = i + 1
            buf = []
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n:
                    j += 1
                buf.append(text[j])
                j += 1
            return "".join(buf), j + 1
        j = i
        while j < n and text[j] not in " \t\r\n,]":
            j += 1
        return text[i:j], j

    def read_pairs(i, stop):
        pairs = []
        while True:
            i = skip_ws(i)
            if i >= n or (stop and text[i] == stop):
                return pairs, i + 1
            if text[i] == "#":
                while i < n and text[i] != "\n":
                    i += 1
                continue
            j = i
            while j < n and text[j] not in " \t=\r\n":
                j += 1
            key = text[i:j].upper()
            j = skip_ws(j)
            if j >= n or text[j] != "=":
                raise ValueError(f"template: expected '=' after {key!r}")
            j = skip_ws(j + 1)
            if j < n and text[j] == "[":
                sub, j = read_pairs(j + 1, "]")
                pairs.append((key, dict(sub)))
            else:
                val, j = read_value(j)
                pairs.append((key, val))
            i = j

    out, _ = read_pairs(0, None)
    return out


def _xml_template(pairs):
    parts = []
    for k, v in pairs:
        if isinstance(v, dict):
            inner = "".join(f"<{kk}><![CDATA[{vv}]]></{kk}>" for kk, vv in v.items())
            parts.append(f"<{k}>{inner}</{k}>")
        else:
            parts.append(f"<{k}><![CDATA[{v}]]></{k}>")
    return "".join(parts)


class _VM:
    def __init__(self, vmid, name, template, hold):
        self.id = vmid
        self.name = name
        self.template = template          # list of pairs
        self.user_template = []
        self.state = VM_HOLD if hold else VM_PENDING
        self.lcm = LCM_INIT
        self.host = None
        self.host_id = -1
        self.stime = int(time.time())
        self.etime = 0
        self.running_polls = 0
        self.pending_deploy = False


class StandinOned:
    """The server. ``start()`` binds 127.0.0.1 on a random port; ``endpoint``
    is the URL to give pyone. ``calls`` records every method name called."""

    def __init__(self, hosts=("node1", "node2"), templates=None, ib_delay=1,
                 session="oneadmin:password", fail_ib=()):
        self.hosts = list(hosts)
        self.session = session
        self.ib_delay = ib_delay
        self.fail_ib = set(fail_ib)       # VM names whose IB never comes up
        self.templates = templates or {0: (
            'NAME = "hpc-ib"\nCPU = "1"\nVCPU = "1"\nMEMORY = "1024"\n'
            'NIC = [ NETWORK = "public", BRIDGE = "br0" ]\n'
            'NIC = [ NETWORK = "ib-pkey-8001", BRIDGE = "ib-sriov", VN_MAD = "dummy", VLAN_ID = "0x8001" ]\n')}
        self.vms = {}
        self.calls = []
        self._next_id = 0
        self._next_ip = 1
        self._lock = threading.Lock()
        self._server = None
        self._thread = None

    # -- lifecycle
    def start(self):
        class Handler(SimpleXMLRPCRequestHandler):
            rpc_paths = ("/RPC2",)

            def log_message(self, *a):
                pass

        self._server = SimpleXMLRPCServer(("127.0.0.1", 0), Handler, allow_none=True,
                                          logRequests=False)
        for name in ("template.info", "template.instantiate", "vm.info", "vm.deploy", "vm.action", "vm.recover",
                     "vmpool.info", "hostpool.info", "system.version"):
            self._server.register_function(self._wrap(name), "one." + name)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def endpoint(self):
        host, port = self._server.server_address
        return f"http://{host}:{port}/RPC2"

    # -- dispatch
    def _wrap(self, name):
        method = getattr(self, "_" + name.replace(".", "_"))

        def call(session, *args):
            with self._lock:
                self.calls.append(name)
                if session != self.session:
                    return [False, "[one.%s] User couldn't be authenticated, aborting call." % name,
                            AUTHENTICATION]
                try:
                    return [True, method(*args), 0]
                except KeyError as e:
                    return [False, f"[one.{name}] Error getting object {e}.", NO_EXISTS]
                except ValueError as e:
                    return [False, f"[one.{name}] {e}", ACTION]
        return call

    # -- one.* methods
    def _system_version(self):
        return "6.8.0"

    def _template_info(self, tid, decrypt=False):
        text = self.templates[int(tid)]
        pairs = _parse_template(text)
        name = dict(pairs).get("NAME", f"template-{tid}")
        return (f"<VMTEMPLATE><ID>{tid}</ID><UID>0</UID><GID>0</GID><UNAME>oneadmin</UNAME>"
                f"<GNAME>oneadmin</GNAME><NAME>{escape(name)}</NAME>{self._perms()}"
                f"<REGTIME>{int(time.time())}</REGTIME><TEMPLATE>{_xml_template(pairs)}</TEMPLATE>"
                f"</VMTEMPLATE>")

    def _template_instantiate(self, tid, name="", hold=False, extra="", persistent=False):
        text = self.templates[int(tid)]
        pairs = [(k, v) for k, v in _parse_template(text) if k != "NAME"]
        if extra:
            pairs += _parse_template(extra)
        vmid = self._next_id
        self._next_id += 1
        name = name or f"one-{vmid}"
        nics = []
        rest = []
        for k, v in pairs:
            if k == "NIC" and isinstance(v, dict):
                nic = dict(v)
                nic["NIC_ID"] = str(len(nics))
                if nic.get("BRIDGE", "").startswith("ib-sriov"):
                    nic["IP"] = f"10.10.{self._next_ip // 250}.{self._next_ip % 250 + 1}"
                else:
                    nic["IP"] = f"192.168.150.{self._next_ip % 250 + 1}"
                self._next_ip += 1
                nic["MAC"] = "02:00:%02x:%02x:%02x:%02x" % tuple(int(x) for x in nic["IP"].split("."))
                nics.append(("NIC", nic))
            else:
                rest.append((k, v))
        # what OneFlow adds to a service's VMs lands in the USER_TEMPLATE, as in oned
        user = [(k, v) for k, v in rest if k in USER_ATTRIBUTES]
        rest = [(k, v) for k, v in rest if k not in USER_ATTRIBUTES]
        tmpl = rest + nics + [("VMID", str(vmid)), ("TEMPLATE_ID", str(tid))]
        self.vms[vmid] = _VM(vmid, name, tmpl, bool(hold))
        self.vms[vmid].user_template = user
        return vmid

    def _vm_deploy(self, vmid, host_id, enforce=False, ds_id=-1, extra=""):
        vm = self.vms[int(vmid)]
        if vm.state not in (VM_HOLD, VM_PENDING):
            raise ValueError(f"Wrong state to perform action: {vm.state}")
        host_id = int(host_id)
        if not 0 <= host_id < len(self.hosts):
            raise KeyError(f"[host {host_id}]")
        vm.host_id = host_id
        vm.host = self.hosts[host_id]
        vm.state, vm.lcm = VM_ACTIVE, LCM_PROLOG
        return int(vmid)

    def _vm_action(self, action, vmid):
        """terminate as OpenNebula 7.4's DispatchManager::terminate decides:
        refused ("wrong state") while ACTIVE in PROLOG, BOOT, EPILOG...;
        in SHUTDOWN only terminate-hard; a DONE VM is left as it is."""
        vm = self.vms[int(vmid)]
        if action in ("terminate", "terminate-hard"):
            if vm.state == VM_DONE:
                return int(vmid)
            if vm.state == VM_ACTIVE:
                if vm.lcm == LCM_RUNNING or (vm.lcm == LCM_SHUTDOWN and action == "terminate-hard"):
                    vm.lcm = LCM_SHUTDOWN
                else:
                    raise ValueError(f"Error performing action \"{action}\": Could not terminate VM "
                                     f"{vmid}, wrong state {LCM_NAMES.get(vm.lcm, vm.lcm)}.")
            else:
                vm.state, vm.lcm, vm.etime = VM_DONE, LCM_INIT, int(time.time())
            return int(vmid)
        raise ValueError(f"action {action!r} not supported by the stand-in")

    def _vm_recover(self, vmid, operation):
        """recover --delete (3) ends a VM in any state, as in OpenNebula; the
        other recover operations are not played by the stand-in."""
        vm = self.vms[int(vmid)]
        if int(operation) != 3:
            raise ValueError(f"recover operation {operation} not supported by the stand-in")
        vm.state, vm.lcm, vm.etime = VM_DONE, LCM_INIT, int(time.time())
        return int(vmid)

    def _step(self, vm):
        if vm.state == VM_ACTIVE:
            if vm.lcm == LCM_PROLOG:
                vm.lcm = LCM_BOOT
            elif vm.lcm == LCM_BOOT:
                vm.lcm = LCM_RUNNING
            elif vm.lcm == LCM_RUNNING:
                vm.running_polls += 1
                if vm.running_polls > self.ib_delay and vm.name not in self.fail_ib and \
                        not any(k == "IB_STATE" for k, _ in vm.user_template):
                    vm.user_template.append(("IB_STATE", "ACTIVE"))
            elif vm.lcm == LCM_SHUTDOWN:
                vm.state, vm.lcm, vm.etime = VM_DONE, LCM_INIT, int(time.time())

    @staticmethod
    def _perms():
        return ("<PERMISSIONS><OWNER_U>1</OWNER_U><OWNER_M>1</OWNER_M><OWNER_A>0</OWNER_A>"
                "<GROUP_U>0</GROUP_U><GROUP_M>0</GROUP_M><GROUP_A>0</GROUP_A><OTHER_U>0</OTHER_U>"
                "<OTHER_M>0</OTHER_M><OTHER_A>0</OTHER_A></PERMISSIONS>")

    def _vm_xml(self, vm):
        hist = ""
        if vm.host is not None:
            hist = (f"<HISTORY_RECORDS><HISTORY><OID>{vm.id}</OID><SEQ>0</SEQ>"
                    f"<HOSTNAME>{escape(vm.host)}</HOSTNAME><HID>{vm.host_id}</HID><CID>0</CID>"
                    f"<STIME>{vm.stime}</STIME><ETIME>0</ETIME><VM_MAD>kvm-sriov</VM_MAD>"
                    f"<TM_MAD>ssh</TM_MAD><DS_ID>0</DS_ID><PSTIME>0</PSTIME><PETIME>0</PETIME>"
                    f"<RSTIME>0</RSTIME><RETIME>0</RETIME><ESTIME>0</ESTIME><EETIME>0</EETIME>"
                    f"<ACTION>0</ACTION><UID>-1</UID><GID>-1</GID><REQUEST_ID>-1</REQUEST_ID>"
                    f"</HISTORY></HISTORY_RECORDS>")
        return (f"<VM><ID>{vm.id}</ID><UID>0</UID><GID>0</GID><UNAME>oneadmin</UNAME>"
                f"<GNAME>oneadmin</GNAME><NAME>{escape(vm.name)}</NAME>{self._perms()}"
                f"<LAST_POLL>0</LAST_POLL><STATE>{vm.state}</STATE><LCM_STATE>{vm.lcm}</LCM_STATE>"
                f"<PREV_STATE>{vm.state}</PREV_STATE><PREV_LCM_STATE>{vm.lcm}</PREV_LCM_STATE>"
                f"<RESCHED>0</RESCHED><STIME>{vm.stime}</STIME><ETIME>{vm.etime}</ETIME>"
                f"<DEPLOY_ID>{'one-%d' % vm.id if vm.host else ''}</DEPLOY_ID>"
                f"<MONITORING></MONITORING><TEMPLATE>{_xml_template(vm.template)}</TEMPLATE>"
                f"<USER_TEMPLATE>{_xml_template(vm.user_template)}</USER_TEMPLATE>"
                f"{hist}</VM>")

    def _vm_info(self, vmid, decrypt=False):
        vm = self.vms[int(vmid)]
        self._step(vm)
        return self._vm_xml(vm)

    def _vmpool_info(self, filt=-2, start=-1, end=-1, state=-1, *rest):
        vms = [vm for vm in self.vms.values()
               if (state == -1 and vm.state != VM_DONE) or vm.state == state or state == -2]
        return "<VM_POOL>" + "".join(self._vm_xml(vm) for vm in vms) + "</VM_POOL>"

    def _hostpool_info(self, *args):
        hosts = []
        for i, name in enumerate(self.hosts):
            hosts.append(
                f"<HOST><ID>{i}</ID><NAME>{escape(name)}</NAME><STATE>2</STATE>"
                f"<PREV_STATE>2</PREV_STATE><IM_MAD>kvm</IM_MAD><VM_MAD>kvm-sriov</VM_MAD>"
                f"<CLUSTER_ID>0</CLUSTER_ID><CLUSTER>default</CLUSTER>"
                f"<HOST_SHARE><MEM_USAGE>0</MEM_USAGE><CPU_USAGE>0</CPU_USAGE>"
                f"<TOTAL_MEM>50331648</TOTAL_MEM><TOTAL_CPU>800</TOTAL_CPU>"
                f"<MAX_MEM>50331648</MAX_MEM><MAX_CPU>800</MAX_CPU><RUNNING_VMS>"
                f"{sum(1 for v in self.vms.values() if v.host_id == i and v.state == VM_ACTIVE)}"
                f"</RUNNING_VMS></HOST_SHARE><VMS></VMS>"
                f"<TEMPLATE><HOSTNAME><![CDATA[{name}]]></HOSTNAME>"
                f"<KVM_SRIOV_VFS_FREE><![CDATA[7]]></KVM_SRIOV_VFS_FREE></TEMPLATE>"
                f"<MONITORING></MONITORING></HOST>")
        return "<HOST_POOL>" + "".join(hosts) + "</HOST_POOL>"


def main():
    import argparse
    ap = argparse.ArgumentParser(description="stand-in oned (XML-RPC) for dry runs")
    ap.add_argument("--hosts", default="node1,node2")
    a = ap.parse_args()
    srv = StandinOned(hosts=a.hosts.split(",")).start()
    print(f"stand-in oned at {srv.endpoint} (session oneadmin:password); Ctrl-C to stop", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        srv.stop()


if __name__ == "__main__":
    main()
