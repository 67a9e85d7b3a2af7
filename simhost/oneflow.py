"""OneFlow and OneGate beside a rung-4 front-end (simhost.frontend.FrontEnd).

    fe = FrontEnd(workdir, ['host1', 'host2'], ...)
    with fe, Services(fe) as svc:              # after fe: started after it, stopped before it
        svc.flow('oneflow-template', 'create', path)   # the real CLI, against this front-end
        svc.gate_get('/service', vm_id=..., token=...)

The servers come from the same OpenNebula 7.4 install as oned
(../shared/opennebula/build.sh links the gems they need: sinatra, thin,
xml-simple, and activates treetop). Each gets a free port on 127.0.0.1 and
writes its logs next to oned's (<front-end>/one/var/oneflow.log, onegate.log,
onehem.log and their .error files).

What a front-end as FrontEnd starts it lacks, and this adds:
- onehem-server.conf points at oned's hook manager ports (FrontEnd moves them
  off 2101/2102 so several front-ends can run; the copied conf still named
  2101/2102, so neither hooks nor OneFlow's events reached oned);
- oneflow-server (its events come from the same oned publisher) and
  onegate-server, both talking to this oned;
- ONEGATE_ENDPOINT in oned.conf: oned reads it only when it starts and needs
  it for any VM whose CONTEXT has TOKEN = "YES", so oned is restarted once
  (about 30 s with the hosts' monitoring) unless oned.conf already had it.
"""
from __future__ import annotations

import base64
import contextlib
import http.client
import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

from simhost.frontend import _free_port_block, _kill_all, _listening

# what an install needs for each server (relative to its prefix)
NEEDS = {
    'oneflow-server': ('bin/oneflow-server', 'lib/oneflow/oneflow-server.rb', 'bin/oneflow-template'),
    'onegate-server': ('bin/onegate-server', 'lib/onegate/onegate-server.rb'),
    'onehem-server': ('bin/onehem-server', 'lib/onehem/onehem-server.rb'),
}
# gems the servers load (share/gems/specifications/<name>-<version>.gemspec)
GEMS = ('sinatra', 'thin', 'xml-simple', 'treetop')
START_TIMEOUT = 60
GATE_REQUEST_SECONDS = 300   # how long OneGate's web server lets one request run
FLOW_READ_TRIES = 3         # a read OneFlow's Thin dropped at its 30 s timeout is asked again


class OneFlowMissing(RuntimeError):
    """The OpenNebula build has no OneFlow/OneGate to run: str() is the one line to show."""


def check_install(prefix: Path) -> None:
    """Raise OneFlowMissing (one line) when prefix lacks a server or a gem they load."""
    prefix = Path(prefix)
    missing = [rel for parts in NEEDS.values() for rel in parts if not (prefix / rel).exists()]
    specs = prefix / 'share' / 'gems' / 'specifications'
    missing += [f'gem {g}' for g in GEMS
                if not any(re.fullmatch(rf'{re.escape(g)}-[\d.]+\.gemspec', p.name)
                           for p in (specs.iterdir() if specs.is_dir() else ()))]
    if missing:
        raise OneFlowMissing(f'the OpenNebula build at {prefix} lacks OneFlow/OneGate ({", ".join(missing)}): '
                             'rebuild it with ../shared/opennebula/build.sh, which installs ruby-sinatra, '
                             'thin and ruby-xml-simple and links them into share/gems')


def _yaml(value, indent: int = 0) -> str:
    """The few YAML shapes the servers' confs use (symbol keys, scalars, maps, lists)."""
    pad = ' ' * indent
    out = []
    for key, val in value.items():
        if isinstance(val, dict):
            out.append(f'{pad}:{key}:\n{_yaml(val, indent + 2)}')
        elif isinstance(val, list):
            out.append(f'{pad}:{key}:\n' + ''.join(f'{pad}  - {json.dumps(v)}\n' for v in val))
        else:
            out.append(f'{pad}:{key}: {json.dumps(val)}\n')
    return ''.join(out)


class Services:
    """onehem-server, oneflow-server and onegate-server for one started FrontEnd.
    gate=False starts no onegate-server: oned then keeps running (it reads
    ONEGATE_ENDPOINT only at start, so OneGate costs a restart of oned and a
    new monitoring of every host)."""

    def __init__(self, fe, gate: bool = True):
        self.fe = fe
        self.gate = gate
        self.flow_port: Optional[int] = None
        self.gate_port: Optional[int] = None
        self._started: list[str] = []

    # -- what callers use ------------------------------------------------------
    @property
    def flow_endpoint(self) -> str:
        return f'http://127.0.0.1:{self.flow_port}'

    @property
    def gate_endpoint(self) -> str:
        return f'http://127.0.0.1:{self.gate_port}'

    @property
    def env(self) -> dict:
        """The front-end's CLI environment plus OneFlow's endpoint (oneflow, oneflow-template)."""
        return dict(self.fe.env, ONEFLOW_URL=self.flow_endpoint)

    def flow(self, *args, check: bool = True, timeout: float = 120,
             auth_file: Optional[str] = None) -> subprocess.CompletedProcess:
        """Run a OneFlow command (oneflow, oneflow-template) against this
        front-end, as oneadmin or as the user of auth_file (ONE_AUTH)."""
        from simhost.frontend import CommandFailed
        cmd = [str(a) for a in args]
        env = self.env if auth_file is None else dict(self.env, ONE_AUTH=str(auth_file))
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise CommandFailed(cmd, p)
        return p

    def scale(self, service_id: int, role: str, cardinality: int, timeout: float = 600) -> None:
        """`oneflow scale`, once the service takes it: OneFlow refuses a scale
        while a role cools down after the last one ("cannot be scaled in
        state: COOLDOWN"), a state a loaded machine can still show after the
        service was seen RUNNING. The timeout only guards against a hang."""
        from simhost.frontend import CommandFailed
        cmd = ('oneflow', 'scale', service_id, role, cardinality)
        deadline = time.monotonic() + timeout
        while True:
            p = self.flow(*cmd, check=False)
            if p.returncode == 0:
                return
            if 'COOLDOWN' not in p.stdout + p.stderr or time.monotonic() > deadline:
                raise CommandFailed(cmd, p)
            time.sleep(1)

    def flow_json(self, *args) -> dict:
        """`<oneflow command> ... --json` parsed."""
        return json.loads(self.flow(*args, '--json').stdout)

    def service(self, service_id: int) -> dict:
        """GET /service/<id> from OneFlow's API as oneadmin: the DOCUMENT."""
        return self._flow_get(f'/service/{int(service_id)}')['DOCUMENT']

    def _flow_get(self, path: str) -> dict:
        """A read from OneFlow's API. oneflow-server's Thin closes a request that
        runs past its 30 s timeout with no answer at all (OneFlow sets no
        server_settings; seen under load as RemoteDisconnected): a read is asked
        again, FLOW_READ_TRIES times in all."""
        req = urllib.request.Request(self.flow_endpoint + path)
        req.add_header('Authorization', 'Basic ' + base64.b64encode(self.fe.session.encode()).decode())
        for tries_left in range(FLOW_READ_TRIES - 1, -1, -1):
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    return json.loads(r.read())
            except (http.client.RemoteDisconnected, ConnectionResetError, TimeoutError):
                if not tries_left:
                    raise

    def gate_get(self, path: str, vm_id=None, token: Optional[str] = None) -> tuple[int, str]:
        """A GET to OneGate as a VM's onegate client makes it (X-ONEGATE-TOKEN,
        X-ONEGATE-VMID; a header left out when None): (HTTP status, body)."""
        req = urllib.request.Request(self.gate_endpoint + path)
        if token is not None:
            req.add_header('X-ONEGATE-TOKEN', token)
        if vm_id is not None:
            req.add_header('X-ONEGATE-VMID', str(vm_id))
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def vm_token(self, vm_id: int) -> str:
        """The OneGate token oned wrote for the VM (var/vms/<id>/token.txt, put
        on its context CD when CONTEXT has TOKEN = "YES")."""
        return (self.fe.one_location / 'var' / 'vms' / str(int(vm_id)) / 'token.txt').read_text().strip()

    def service_state(self, service_id: int) -> str:
        from_flow = self.service(service_id)['TEMPLATE']['BODY']
        return SERVICE_STATES[int(from_flow['state'])]

    def failure(self, service_id: int, body: Optional[dict] = None) -> Optional[str]:
        """None while the service is in no FAILED_* state; else one line with
        the state and OneFlow's own reason (the last error of the service's
        log, e.g. a role's instantiate that oned refused or never answered)."""
        body = body or self.service(service_id)['TEMPLATE']['BODY']
        state = SERVICE_STATES[int(body['state'])]
        if 'FAIL' not in state:
            return None
        errors = [e.get('message', '') for e in body.get('log', []) if e.get('severity') == 'E']
        return (f'service {service_id} is {state}: {errors[-1] if errors else "OneFlow logged no error"} '
                f'(see {self.fe.one_location / "var" / "oneflow.log"})')

    def wait_service(self, service_id: int, want: str, timeout: float = 300) -> dict:
        """Wait until OneFlow reports the service in state `want` (a *FAILED*
        state not wanted raises at once, with OneFlow's reason); returns the service body."""
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            body = self.service(service_id)['TEMPLATE']['BODY']
            state = SERVICE_STATES[int(body['state'])]
            if state == want:
                return body
            if 'FAIL' not in want and (failed := self.failure(service_id, body)):
                raise RuntimeError(f'{failed} (waiting for {want})')
            time.sleep(1)
        raise TimeoutError(f'service {service_id} still {state} after {timeout} s (waiting for {want})')

    # -- lifecycle -------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self) -> None:
        """Start the servers; what was started is stopped again when a step fails."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        fe = self.fe
        if fe.port is None:
            raise RuntimeError('start the FrontEnd before its OneFlow/OneGate services')
        check_install(fe.prefix)
        base = _free_port_block(2, start=fe.port + 100)
        self.flow_port, self.gate_port = base, base + 1
        etc, var = fe.one_location / 'etc', fe.one_location / 'var'
        publisher, replier = self._hook_ports()
        (etc / 'onehem-server.conf').write_text(_yaml({
            'debug_level': 2,
            'hook_base_path': str(fe.one_location / 'var' / 'remotes' / 'hooks'),
            'remote_hook_base_path': '/var/tmp/one/hooks',
            'subscriber_endpoint': f'tcp://127.0.0.1:{publisher}',
            'replier_endpoint': f'tcp://127.0.0.1:{replier}',
            'concurrency': 10}))
        (etc / 'oneflow-server.conf').write_text(_yaml({
            'one_xmlrpc': fe.endpoint, 'subscriber_endpoint': f'tcp://127.0.0.1:{publisher}',
            'autoscaler_interval': 90, 'host': '127.0.0.1', 'port': self.flow_port,
            'force_deletion': False, 'retries': 5, 'default_cooldown': 300, 'wait_timeout': 30,
            'concurrency': 10, 'shutdown_action': 'terminate', 'action_number': 1, 'action_period': 60,
            'vm_name_template': '$ROLE_NAME_$VM_NUMBER_(service_$SERVICE_ID)', 'page_size': 10,
            'core_auth': 'cipher', 'log': {'level': 2, 'system': 'file'}}))
        stock_gate = (fe.prefix / 'etc' / 'onegate-server.conf').read_text()
        gate = re.sub(r'^:one_xmlrpc:.*$', f':one_xmlrpc: {fe.endpoint}', stock_gate, flags=re.M)
        # Thin ends a connection whose request runs longer than its timeout (30 s) with no
        # answer at all; OneGate's /service?extended=true asks oned for each VM in turn
        # and took 29.8 s for 4 VMs on this loaded 2-core machine
        gate = re.sub(r'^(  :port:) 5030$', rf'\g<1> {self.gate_port}\n  :server_settings:\n'
                      rf'    :timeout: {GATE_REQUEST_SECONDS}', gate, flags=re.M)
        gate = re.sub(r'^:oneflow_server:.*$', f':oneflow_server: {self.flow_endpoint}', gate, flags=re.M)
        if gate.count(str(self.gate_port)) != 1 or self.flow_endpoint not in gate or fe.endpoint not in gate:
            raise RuntimeError(f'{fe.prefix}/etc/onegate-server.conf: :one_xmlrpc:, :port: 5030 or '
                               ':oneflow_server: not found')
        (etc / 'onegate-server.conf').write_text(gate)
        oned_conf = etc / 'oned.conf'
        text = oned_conf.read_text()
        want = f'ONEGATE_ENDPOINT = "{self.gate_endpoint}"'
        if self.gate and want not in text:
            # oned reads it only at start: `one restart` restarts oned and onehem-server
            oned_conf.write_text(re.sub(r'^ONEGATE_ENDPOINT\s*=.*\n', '', text, flags=re.M) + want + '\n')
            self._run('one', 'restart', timeout=180)
            self._wait_oned_and_hosts()
        else:
            self._run('onehem-server', 'stop', check=False)
            self._run('onehem-server', 'start')
        servers = [('oneflow-server', self.flow_port)] + ([('onegate-server', self.gate_port)] if self.gate else [])
        for server, port in servers:
            self._run(server, 'start')
            self._started.append(server)
            self._wait_listening(server, port, var)

    def stop(self) -> None:
        """Stop the servers this started (the front-end's `one stop` stops onehem-server)."""
        if not self._started:
            return
        var = self.fe.one_location / 'var'
        for server in reversed(self._started):
            pid_file = var / PID_FILES[server]
            pid = None
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text().split()[0])
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._run(server, 'stop', check=False, timeout=30)
            if pid is not None:  # `stop` sends SIGINT and does not wait
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and Path(f'/proc/{pid}').exists():
                    time.sleep(0.2)
                _kill_all([pid])
        self._started.clear()

    # -- helpers ----------------------------------------------------------------
    def _run(self, *cmd, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        p = subprocess.run([str(c) for c in cmd], env=self.fe.env, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL, start_new_session=True)
        if check and p.returncode != 0:
            raise RuntimeError(f'{" ".join(map(str, cmd))} -> rc={p.returncode}: '
                               f'{(p.stdout + p.stderr).strip()[-1000:]}')
        return p

    def _hook_ports(self) -> tuple[int, int]:
        """oned's hook manager ports (HM_MAD -p publisher -l replier) from its oned.conf."""
        m = re.search(r'-p (\d+) -l (\d+)', (self.fe.one_location / 'etc' / 'oned.conf').read_text())
        if not m:
            raise RuntimeError('oned.conf: the hook manager arguments (-p <port> -l <port>) were not found')
        return int(m.group(1)), int(m.group(2))

    def _wait_oned_and_hosts(self) -> None:
        deadline = time.monotonic() + 240
        while True:
            try:
                self.fe.info('user', 0)
                break
            except (OSError, RuntimeError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f'oned did not come back after the restart; see '
                                       f'{self.fe.one_location}/var/oned.log') from None
                time.sleep(0.5)
        for name in self.fe.hosts:
            self.fe.wait_host(name)

    def _wait_listening(self, server: str, port: int, var: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        pid_file = var / PID_FILES[server]
        while not _listening(port):
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text().split()[0])
                if not Path(f'/proc/{pid}').exists():
                    raise RuntimeError(f'{server} exited: {_tail(var / LOGS[server][1])}'
                                       f' (see {var / LOGS[server][0]})')
            if time.monotonic() > deadline:
                raise RuntimeError(f'{server} does not listen on {port} after {START_TIMEOUT} s; '
                                   f'see {var / LOGS[server][0]}')
            time.sleep(0.3)


PID_FILES = {'oneflow-server': 'oneflow.pid', 'onegate-server': 'onegate.pid'}
LOGS = {'oneflow-server': ('oneflow.log', 'oneflow.error'), 'onegate-server': ('onegate.log', 'onegate.error')}
# src/flow/lib/models/service.rb, Service::STATE
SERVICE_STATES = ('PENDING', 'DEPLOYING', 'RUNNING', 'UNDEPLOYING', 'WARNING', 'DONE',
                  'FAILED_UNDEPLOYING', 'FAILED_DEPLOYING', 'SCALING', 'FAILED_SCALING', 'COOLDOWN',
                  'DEPLOYING_NETS', 'UNDEPLOYING_NETS', 'FAILED_DEPLOYING_NETS', 'FAILED_UNDEPLOYING_NETS',
                  'HOLD')


def _tail(path: Path, lines: int = 3) -> str:
    with contextlib.suppress(OSError):
        return ' | '.join(path.read_text(errors='replace').strip().splitlines()[-lines:])
    return '(no log)'


def main(argv: list) -> int:
    """python3 -m simhost.oneflow --check: one line, exit 2 when the build lacks OneFlow/OneGate."""
    from simhost.frontend import OpenNebulaMissing, locate_install
    if argv[:1] != ['--check']:
        print('usage: python3 -m simhost.oneflow --check')
        return 2
    try:
        check_install(locate_install())
    except (OpenNebulaMissing, OneFlowMissing) as e:
        print(f'OneFlow cannot run: {e}')
        return 2
    print('OneFlow, OneGate and onehem-server are in the OpenNebula build')
    return 0


if __name__ == '__main__':
    import sys
    sys.exit(main(sys.argv[1:]))
