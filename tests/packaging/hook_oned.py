"""A stand-in for oned's hook calls (one.hookpool.info, one.hook.allocate,
one.hook.update) over XML-RPC on 127.0.0.1, for what Puppet and Ansible run
as oneadmin (`python3 -m kvm_sriov.frontend.network_hook`). Answers only the
given session, as oned does."""

import re
import threading
from xml.sax.saxutils import escape
from xmlrpc.server import SimpleXMLRPCRequestHandler, SimpleXMLRPCServer


class _Quiet(SimpleXMLRPCRequestHandler):
    def log_message(self, *_args):
        pass


def _attrs(template: str) -> dict:
    return {k: re.sub(r"\\(.)", r"\1", v) for k, v in re.findall(r'(\w+) = "((?:[^"\\]|\\.)*)"', template)}


class HookOned:
    def __init__(self, session: str = "oneadmin:secret"):
        self.session, self.hooks, self.writes = session, {}, []
        self.server = SimpleXMLRPCServer(("127.0.0.1", 0), requestHandler=_Quiet, logRequests=False,
                                         allow_none=True)
        for name, fn in (("one.hookpool.info", self.pool), ("one.hook.allocate", self.allocate),
                         ("one.hook.update", self.update)):
            self.server.register_function(fn, name)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/RPC2"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_exc):
        self.server.shutdown()
        self.server.server_close()

    def _denied(self, session):
        return None if session == self.session else [False, "[one.hook] User couldn't be authenticated", 256]

    def pool(self, session, *_filter):
        if self._denied(session):
            return self._denied(session)
        body = "".join(
            f"<HOOK><ID>{i}</ID><NAME>{escape(h['NAME'])}</NAME><TEMPLATE>"
            + "".join(f"<{k}>{escape(v)}</{k}>" for k, v in h.items()) + "</TEMPLATE></HOOK>"
            for i, h in self.hooks.items())
        return [True, f"<HOOK_POOL>{body}</HOOK_POOL>", 0]

    def allocate(self, session, template):
        if self._denied(session):
            return self._denied(session)
        hid = len(self.hooks)
        self.hooks[hid] = _attrs(template)
        self.writes.append(("allocate", hid))
        return [True, hid, 0]

    def update(self, session, hid, template, _kind):
        if self._denied(session):
            return self._denied(session)
        self.hooks[hid] = _attrs(template)
        self.writes.append(("update", hid))
        return [True, hid, 0]
