"""A stand-in for UFM's PKey REST API, for tests: UFM itself cannot run here.

The standard library's http.server, over TLS when given a certificate (a
self-signed one made by the test) or plain HTTP where the test is not about
TLS. It keeps PKeys and their GUIDs in memory and answers as UFM's
documentation and the clients that run against UFM say it does; where they
say nothing the answer chosen is said here, and kvm-sriov's client must not
depend on it. Sources (read, nothing copied):

[guide]   NVIDIA UFM Enterprise REST API Guide, "PKey GUIDs Rest API"
          https://docs.nvidia.com/networking/display/UFMEnterpriseRESTAPILatest/PKey+GUIDs+Rest+API
          (and v6.22.1: .../ufmenterpriserestapiv6221/pkey+guids+rest+api, with /pkeys/add)
[auth]    same guide, "REST API Complementary Information": basic authentication,
          curl -u <username>:<password> https://<ufm-ip>/ufmRest/...
          https://docs.nvidia.com/networking/display/ufmenterpriserestapiv6221/REST+API+Complementary+Information
[ibk8s]   https://github.com/Mellanox/ib-kubernetes pkg/sm/plugins/ufm/ufm.go (a client run
          against UFM: AddGuidsToPKey, RemoveGuidsFromPKey, ListGuidsInUse)
[openbce] https://github.com/openbce/kperf pkg/ufm/ufm.go (GetIBNetwork, ListIBNetwork,
          DeleteIBNetwork)
[ufm-rs]  https://github.com/openbce/ufmclient client/src/lib.rs, client/src/rest.rs
          (create_partition, get_partition, list_partition, delete_partition)
[mock]    NVIDIA config-manager's UFM mock for its IB PKey workflows (Apache-2.0; found by its
          text, the search tool did not name its repository): its remove path, and "Like real
          UFM, a partition is auto-removed once its last member is removed"
[mcp]     https://github.com/vhspace/ufm-mcp (ufm_remove_guids_from_pkey's error hint)

Requests and answers:
- Every request: basic auth [auth]. Missing or wrong: 401 with an HTML body (a login page:
  the body is not UFM's JSON, the client relies on the status only).
- GET /ufmRest/resources/pkeys[?guids_data=true]: one JSON object, PKey -> {"partition",
  "ip_over_ib", "index0"} and, with guids_data=true, "guids": [{"guid", "membership",
  "index0"}]; GUIDs as 16 hex digits without 0x [ibk8s ListGuidsInUse, ufm-rs list_partition].
  The keys are PKeys as UFM writes them ("0x12" in the guide's examples: no padding).
- GET /ufmRest/resources/pkeys/<pkey>?guids_data=true: that object alone; a PKey UFM does
  not have is HTTP 200 with {} (the quirk [openbce] GetIBNetwork and [ufm-rs] get_partition
  test for: string(data) == "{}" -> not found).
- POST /ufmRest/resources/pkeys/add {"pkey", "index0", "ip_over_ib", ...}: a PKey without
  GUIDs; "The required parameters are PKey only" [guide]. A PKey it has already: not
  documented; answered 409 here.
- POST /ufmRest/resources/pkeys {"pkey", "guids", "index0", "ip_over_ib", "membership"}:
  GUIDs added ("Each GUID is a hexadecimal string with a minimum length of 16 characters and
  maximum length of 20 characters"; pkey "between 0x0-0x7fff exclusive"; membership "full" |
  "limited", default full; ip_over_ib default true; index0 default false [guide]); the PKey
  is made when UFM does not have it ([ibk8s] AddGuidsToPKey never makes it first). A GUID it
  has already takes the new membership (not documented). Out of range: 400.
- DELETE /ufmRest/resources/pkeys/<pkey>/guids/<guid>,<guid>...: GUIDs removed ("Remove GUIDs
  from PKey" [guide]; the path as [mock] serves it). A PKey it does not have: 404; a GUID
  that is not a member: 400 (not documented; [mcp] hints "One or more GUIDs may not exist in
  this pkey" for such an error). Quirk: the PKey goes with its last member [mock].
- DELETE /ufmRest/resources/pkeys/<pkey>: the PKey removed ("Delete PKey" [guide];
  [openbce] DeleteIBNetwork, [ufm-rs] delete_partition). One it does not have: 404 (not
  documented).
- Anything else: 404.

Faults a test asks for: ``faults`` (answers to give first, one per request: an HTTP status,
or "slow" to wait ``slow_seconds`` before answering as usual), ``always`` (one status for
every request), ``before`` (called with (method, path) before a request is served), ``raw``
(a body to answer every request with, garbage included), ``headers`` (added to every answer).
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional
from urllib.parse import parse_qs, urlsplit

API = "/ufmRest/resources/pkeys"
GUID = re.compile(r"(0x)?[0-9a-fA-F]{16,20}")


class UFMStandin:
    def __init__(self, user: str = "admin", password: str = "123456", tls: Optional[tuple] = None):
        self.credentials = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.pkeys: dict[int, dict] = {}
        self.requests: list[tuple[str, str, object, int]] = []   # method, path, body, status
        self.faults: list = []
        self.always: Optional[int] = None
        self.slow_seconds = 0.0
        self.before: Optional[Callable] = None
        self.raw: Optional[bytes] = None      # when set, every answer's body (HTTP 200): garbage on demand
        self.headers: dict[str, str] = {}      # added to every answer
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                outer._serve(self, "GET")

            def do_POST(self):
                outer._serve(self, "POST")

            def do_DELETE(self):
                outer._serve(self, "DELETE")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- what a test looks at ----------------------------------------------------------
    def members(self, pkey: int) -> dict[str, str]:
        with self.lock:
            return {g: m["membership"] for g, m in self.pkeys.get(pkey, {}).get("guids", {}).items()}

    def calls(self, method: Optional[str] = None) -> list[tuple[str, str, object, int]]:
        return [r for r in self.requests if method is None or r[0] == method]

    # -- one request ---------------------------------------------------------------------
    def _serve(self, h: BaseHTTPRequestHandler, method: str) -> None:
        size = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(size) if size else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        url = urlsplit(h.path)
        if self.before is not None:
            self.before(method, url.path)
        with self.lock:
            fault = self.faults.pop(0) if self.faults else None
        if fault == "slow":
            time.sleep(self.slow_seconds)
            fault = None
        if h.headers.get("Authorization") != f"Basic {self.credentials}":
            status, answer = 401, b"<html><body>Login to UFM</body></html>"
        elif self.raw is not None:
            status, answer = 200, self.raw
        elif self.always is not None or fault is not None:
            status, answer = self.always or fault, json.dumps({"error": "Internal error"}).encode()
        else:
            with self.lock:
                status, data = self._route(method, url.path, parse_qs(url.query), body)
            answer = json.dumps(data).encode()
        self.requests.append((method, url.path, body, status))
        h.send_response(status)
        h.send_header("Content-Type", "text/html" if status == 401 else "application/json")
        h.send_header("Content-Length", str(len(answer)))
        for name, value in self.headers.items():
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(answer)

    def _route(self, method: str, path: str, query: dict, body) -> tuple[int, object]:
        guids_data = query.get("guids_data") == ["true"]
        if path.rstrip("/") == API and method == "GET":
            return 200, {f"0x{k:x}": self._shown(k, guids_data) for k in sorted(self.pkeys)}
        if path == f"{API}/add" and method == "POST":
            key = _pkey(body)
            if key is None:
                return 400, {"error": "invalid pkey"}
            if key in self.pkeys:
                return 409, {"error": f"PKey 0x{key:x} already exists"}
            self.pkeys[key] = _new(body)
            return 200, {}
        if path.rstrip("/") == API and method == "POST":
            key = _pkey(body)
            guids = body.get("guids") if isinstance(body, dict) else None
            membership = body.get("membership", "full") if isinstance(body, dict) else None
            if key is None or not isinstance(guids, list) or membership not in ("full", "limited") or not all(
                    isinstance(g, str) and GUID.fullmatch(g) for g in guids):
                return 400, {"error": "invalid pkey, guids or membership"}
            entry = self.pkeys.setdefault(key, _new(body))
            for g in guids:
                entry["guids"][_norm(g)] = {"membership": membership, "index0": bool(body.get("index0", False))}
            return 200, {}
        found = re.fullmatch(rf"{API}/(0x[0-9a-fA-F]{{1,4}})(?:/guids/([^/]+))?", path)
        if found is None:
            return 404, {"error": "Not Found"}
        key = int(found.group(1), 16) & 0x7FFF
        if method == "GET" and found.group(2) is None:
            return 200, self._shown(key, guids_data) if key in self.pkeys else {}
        if method == "DELETE" and found.group(2) is None:
            if self.pkeys.pop(key, None) is None:
                return 404, {"error": f"PKey 0x{key:x} not found"}
            return 200, {}
        if method == "DELETE":
            if key not in self.pkeys:
                return 404, {"error": f"PKey 0x{key:x} not found"}
            guids = [_norm(g) for g in found.group(2).split(",") if g]
            members = self.pkeys[key]["guids"]
            if not guids or any(g not in members for g in guids):
                return 400, {"error": "GUIDs are not members of the PKey"}
            for g in guids:
                del members[g]
            if not members:
                del self.pkeys[key]
            return 200, {}
        return 404, {"error": "Not Found"}

    def _shown(self, key: int, guids_data: bool) -> dict:
        entry = self.pkeys[key]
        out = {"partition": entry["partition"], "ip_over_ib": entry["ip_over_ib"], "index0": entry["index0"]}
        if guids_data:
            out["guids"] = [{"guid": g, **m} for g, m in sorted(entry["guids"].items())]
        return out


def _pkey(body) -> Optional[int]:
    text = body.get("pkey") if isinstance(body, dict) else None
    if not isinstance(text, str) or not re.fullmatch(r"0x[0-9a-fA-F]{1,4}", text):
        return None
    value = int(text, 16)
    return value if 0 < value < 0x7FFF else None


def _new(body) -> dict:
    return {"partition": body.get("partition_name", ""),
            "ip_over_ib": bool(body.get("ip_over_ib", True)), "index0": bool(body.get("index0", False)),
            "guids": {}}


def _norm(guid: str) -> str:
    return guid.lower().removeprefix("0x")
