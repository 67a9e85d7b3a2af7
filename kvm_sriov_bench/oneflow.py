"""A OneFlow service as the harness's target: its VMs, hosts and MPI hostfile.

OneFlow's API (GET /service/<id>, GET /service; HTTP basic auth with the
same user:password as oned) gives the service's state and, per role, the
IDs of its VMs; oned (pyone) gives each VM's state, host, VCPU and the NIC on
the kvm-sriov marker bridge. A service is a tenant's document (its owner can
rewrite the body through one.document.update), and a VM template is the
tenant's too: every answer is read up to MAX_BYTES, every value is checked
(IDs, names, counts, addresses, host names) and a VM must say it belongs to
the service (SERVICE_ID, which OneFlow sets and only who may manage the VM can
change). Nothing read reaches a path or a shell.
"""
from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from .errors import OrchestrationError

MAX_BYTES = 8 << 20        # a 4096-VM service body is ~1.5 MB
MAX_VMS = 4096
MAX_ROLES = 256
MAX_SLOTS = 4096
# OneFlow 7.4's Service::STATE, by number (src/flow/lib/models/service.rb)
STATES = ("PENDING", "DEPLOYING", "RUNNING", "UNDEPLOYING", "WARNING", "DONE", "FAILED_UNDEPLOYING",
          "FAILED_DEPLOYING", "SCALING", "FAILED_SCALING", "COOLDOWN", "DEPLOYING_NETS",
          "UNDEPLOYING_NETS", "FAILED_DEPLOYING_NETS", "FAILED_UNDEPLOYING_NETS", "HOLD")
# states a service does not leave towards RUNNING by itself
STATES_STOPPED = {"UNDEPLOYING", "DONE", "FAILED_UNDEPLOYING", "FAILED_DEPLOYING", "FAILED_SCALING",
                  "UNDEPLOYING_NETS", "FAILED_DEPLOYING_NETS", "FAILED_UNDEPLOYING_NETS"}
NAME = re.compile(r"[^\x00-\x1f\x7f]{1,128}")
HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
URL = re.compile(r"https?://[A-Za-z0-9.\-]{1,253}(:\d{1,5})?|https?://\[[0-9A-Fa-f:.]{2,45}\](:\d{1,5})?")
DEFAULT_URL = "http://localhost:2474"


def _show(value, limit=40):
    """A value from the answer as it may appear in an error: short, one line."""
    return repr(value if not isinstance(value, str) else value[:limit])[:limit + 10]


def _id(value, what):
    """A whole number 0..2^31-1 given as int or digits (OneFlow writes both)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise OrchestrationError(f"{what} {_show(value)} is not an ID")
    text = str(value)
    if not re.fullmatch(r"\d{1,10}", text) or int(text) > 2 ** 31 - 1:
        raise OrchestrationError(f"{what} {_show(value)} is not an ID")
    return int(text)


def _name(value, what):
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise OrchestrationError(f"{what} {_show(value)} is not a name (1-128 printable characters)")
    return value


def check_url(url):
    """OneFlow's URL: http(s)://host[:port][/path], no credentials in it."""
    url = (url or "").strip().rstrip("/")
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        parts = urllib.parse.urlsplit("")
    base = f"{parts.scheme}://{parts.netloc}"
    if (not URL.fullmatch(base) or parts.query or parts.fragment
            or not re.fullmatch(r"(/[A-Za-z0-9._~-]{1,64}){0,8}", parts.path)
            or {".", ".."} & set(parts.path.split("/"))):
        raise OrchestrationError(f"OneFlow URL {_show(url, 80)} is not http(s)://host[:port][/path] "
                                 "(credentials come from the session, not the URL)")
    return url


@dataclass
class Service:
    id: int
    name: str
    state: str
    roles: dict = field(default_factory=dict)   # role name -> [VM IDs], the document's order

    @property
    def vm_ids(self):
        return [v for ids in self.roles.values() for v in ids]

    def describe(self, hosts=()):
        roles = "; ".join(f"{r}: {','.join(map(str, ids)) or '-'}" for r, ids in self.roles.items())
        text = f"service {self.id} {self.name!r} (roles {roles})"
        return text + (f" on {', '.join(hosts)}" if hosts else "")


def parse_service(doc, want_id=None):
    """GET /service/<id>'s answer -> Service, or OrchestrationError (one line)."""
    d = doc.get("DOCUMENT") if isinstance(doc, dict) else None
    if not isinstance(d, dict):
        raise OrchestrationError("OneFlow's answer has no DOCUMENT")
    sid = _id(d.get("ID"), "service ID")
    if want_id is not None and sid != want_id:
        raise OrchestrationError(f"OneFlow answered service {sid} for service {want_id}")
    name = _name(d.get("NAME"), f"service {sid}: name")
    body = (d.get("TEMPLATE") or {}).get("BODY") if isinstance(d.get("TEMPLATE"), dict) else None
    if not isinstance(body, dict):
        raise OrchestrationError(f"service {sid}: no TEMPLATE/BODY")
    state = body.get("state")
    if isinstance(state, bool) or not isinstance(state, (int, str)) or \
            not re.fullmatch(r"\d{1,2}", str(state)) or int(state) >= len(STATES):
        raise OrchestrationError(f"service {sid}: state {_show(state)} is not one of OneFlow's")
    roles = body.get("roles")
    if not isinstance(roles, list) or len(roles) > MAX_ROLES:
        raise OrchestrationError(f"service {sid}: roles is not a list of at most {MAX_ROLES}")
    out, seen, count = {}, set(), 0
    for role in roles:
        if not isinstance(role, dict):
            raise OrchestrationError(f"service {sid}: a role is not an object")
        rname = _name(role.get("name"), f"service {sid}: role name")
        if rname in out:
            raise OrchestrationError(f"service {sid}: role {rname!r} twice")
        nodes = role.get("nodes") or []
        if not isinstance(nodes, list):
            raise OrchestrationError(f"service {sid}: role {rname!r}: nodes is not a list")
        ids = []
        for node in nodes:
            count += 1
            if count > MAX_VMS:
                raise OrchestrationError(f"service {sid}: more than {MAX_VMS} VMs")
            if not isinstance(node, dict):
                raise OrchestrationError(f"service {sid}: role {rname!r}: a node is not an object")
            vm = _id(node.get("deploy_id"), f"service {sid}: role {rname!r}: VM")
            if vm in seen:
                raise OrchestrationError(f"service {sid}: VM {vm} listed twice")
            seen.add(vm)
            ids.append(vm)
        out[rname] = ids
    return Service(sid, name, STATES[int(state)], out)


def service_ids_named(doc, name):
    """GET /service's answer -> the IDs of the services called `name`."""
    pool = doc.get("DOCUMENT_POOL") if isinstance(doc, dict) else None
    docs = pool.get("DOCUMENT") if isinstance(pool, dict) else None
    if docs is None:
        return []                     # an empty pool
    docs = docs if isinstance(docs, list) else [docs]
    if len(docs) > 100000:
        raise OrchestrationError("OneFlow's service list is too long")
    ids = []
    for d in docs:
        if isinstance(d, dict) and d.get("NAME") == name:
            ids.append(_id(d.get("ID"), f"service {name!r}: ID"))
    return ids


class OneFlow:
    """OneFlow's API as the user of the session (user:password)."""

    def __init__(self, url, session, timeout=30):
        self.url = check_url(url)
        self.auth = "Basic " + base64.b64encode(session.encode()).decode()
        self.timeout = timeout

    def get(self, path):
        req = urllib.request.Request(self.url + path, headers={"Authorization": self.auth,
                                                               "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                body = r.read(MAX_BYTES + 1)
        except urllib.error.HTTPError as e:
            text = re.sub(r"[\x00-\x1f\x7f]+", " ", e.read(300).decode(errors="replace")).strip()[:200]
            raise OrchestrationError(f"OneFlow {self.url}{path}: HTTP {e.code} {text}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise OrchestrationError(f"OneFlow at {self.url} cannot be reached: {e} "
                                     "(--oneflow URL or ONEFLOW_URL)") from None
        if len(body) > MAX_BYTES:
            raise OrchestrationError(f"OneFlow {path}: the answer is over {MAX_BYTES} bytes")
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            raise OrchestrationError(f"OneFlow {path}: the answer is not JSON") from None

    def service_id(self, ref):
        """A service given by ID or by name (exactly one service of that name)."""
        ref = str(ref).strip()
        if re.fullmatch(r"\d{1,10}", ref):
            return _id(ref, "service")
        _name(ref, "service")
        ids = service_ids_named(self.get("/service"), ref)
        if len(ids) != 1:
            raise OrchestrationError(f"service {ref!r}: " + (
                "no service of that name" if not ids else
                f"{len(ids)} services of that name ({', '.join(map(str, ids))}): give the ID"))
        return ids[0]

    def service(self, sid):
        return parse_service(self.get(f"/service/{int(sid)}"), want_id=int(sid))
