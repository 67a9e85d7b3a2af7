"""Runners: build and run OSU, perftest, HPL (xhpl) and hpcc commands through
the site's MPI launcher, repeat trials, and collect tidy rows.

Binaries come from the user's system (PATH, an OSU install folder, HPC-X,
Spack, modules); only ``hpcc`` and the harness's own mpi4py ping-pong are
packaged on Debian.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from . import hpldat, osu
from .errors import HarnessError, ParseError, RunError
from .names import PERFTEST, PLACEMENTS
from .parsers import MAX_INPUT, parse_text

OSU_ALL = osu.RUNNABLE
# The seed paper's configurations: VMs per host x hosts (plus bare metal).
PAPER_VMS_PER_HOST = (1, 2, 4, 7)
PAPER_HOSTS = (2, 8)


def paper_configs():
    """[(hosts, vms_per_host)] for the paper's figures 4-9."""
    return [(h, v) for h in PAPER_HOSTS for v in PAPER_VMS_PER_HOST]


def size_sweep(min_size=1, max_size=4 * 1024 * 1024):
    """Powers of two from min to max (OSU's default sweep)."""
    out, s = [], max(1, min_size)
    while s <= max_size:
        out.append(s)
        s *= 2
    return out


@dataclass
class Launcher:
    """How ranks are started: OpenMPI's ``mpirun``, Slurm's ``srun`` or none."""
    kind: str = "mpirun"
    program: str | None = None             # path to mpirun/srun
    hosts: list = field(default_factory=list)   # [] = this machine
    ranks_per_node: int = 1
    bind: str | None = "core"              # core | socket | none
    hostfile: str | None = None
    extra: list = field(default_factory=list)
    env: dict = field(default_factory=dict)
    allow_root: bool | None = None         # None: when running as root
    oversubscribe: bool = False
    host_of: dict = field(default_factory=dict)  # node (VM address) -> physical host

    def total_ranks(self):
        return max(1, len(self.hosts)) * self.ranks_per_node

    def physical(self, node):
        return self.host_of.get(node, node)

    def pair(self, placement):
        """The two nodes for a 2-rank benchmark: [(node, ranks)], or None when
        the nodes given cannot hold that placement. No nodes = this machine,
        which is only same-host."""
        if not self.hosts:
            return [] if placement == "same-host" else None
        first = {}
        for node in self.hosts:
            first.setdefault(self.physical(node), []).append(node)
        hosts = list(first)
        if placement == "inter-host":
            return [(first[hosts[0]][0], 1), (first[hosts[1]][0], 1)] if len(hosts) >= 2 else None
        if placement == "same-host":
            nodes = first[hosts[0]]
            if len(nodes) >= 2:
                return [(nodes[0], 1), (nodes[1], 1)]
            return [(nodes[0], 2)] if self.physical(nodes[0]) == nodes[0] else None
        raise HarnessError(f"unknown placement {placement!r} ({', '.join(PLACEMENTS)})")

    def command(self, argv, ranks=None, ranks_per_node=None, placement=None):
        """The launch command. ``placement`` [(node, ranks)] pins ranks to
        nodes explicitly (and overrides the hostfile); [] = this machine."""
        if placement is not None:
            return self._placed(argv, placement)
        ppn = ranks_per_node or self.ranks_per_node
        n = ranks or (max(1, len(self.hosts)) * ppn)
        if self.kind == "none":
            return list(argv)
        if self.kind == "srun":
            cmd = [self.program or "srun", "-n", str(n)]
            if self.hosts:
                nodes = max(1, -(-n // ppn))
                cmd += ["-N", str(nodes), f"--ntasks-per-node={ppn}",
                        "--nodelist=" + ",".join(self.hosts[:nodes])]
            if self.bind:
                cmd.append("--cpu-bind=" + ("none" if self.bind == "none" else self.bind + "s"))
            if self.env:
                cmd.append("--export=ALL," + ",".join(f"{k}={v}" for k, v in sorted(self.env.items())))
            return cmd + list(self.extra) + list(argv)
        if self.kind != "mpirun":
            raise HarnessError(f"unknown launcher {self.kind!r} (mpirun, srun or none)")
        cmd = [self.program or "mpirun", "-np", str(n)]
        if self.hostfile:
            cmd += ["--hostfile", self.hostfile]
        elif self.hosts:
            cmd += ["--host", ",".join(f"{h}:{ppn}" for h in self.hosts)]
        if self.hosts or self.hostfile:
            cmd += ["--map-by", f"ppr:{ppn}:node"]
        return cmd + self._mpirun_tail() + list(argv)

    def _mpirun_tail(self):
        cmd = []
        if self.bind:
            cmd += ["--bind-to", self.bind]
        allow_root = self.allow_root if self.allow_root is not None else os.geteuid() == 0
        if allow_root:
            cmd.append("--allow-run-as-root")
        if self.oversubscribe:
            cmd.append("--oversubscribe")
        for k in sorted(self.env):
            cmd += ["-x", f"{k}={self.env[k]}"]
        return cmd + list(self.extra)

    def _placed(self, argv, placement):
        n = sum(r for _, r in placement) or 2
        if self.kind == "none":
            return list(argv)
        if self.kind == "srun":
            cmd = [self.program or "srun", "-n", str(n)]
            if placement:
                cmd += ["-N", str(len(placement)), "--nodelist=" + ",".join(h for h, _ in placement),
                        "--distribution=block"]
                if len(placement) == 1:
                    cmd.append(f"--ntasks-per-node={n}")
            if self.bind:
                cmd.append("--cpu-bind=" + ("none" if self.bind == "none" else self.bind + "s"))
            if self.env:
                cmd.append("--export=ALL," + ",".join(f"{k}={v}" for k, v in sorted(self.env.items())))
            return cmd + list(self.extra) + list(argv)
        cmd = [self.program or "mpirun", "-np", str(n)]
        if placement:
            # by slot, in the order given: rank 0 on the first node, rank 1 on the second
            cmd += ["--host", ",".join(f"{h}:{r}" for h, r in placement), "--map-by", "slot"]
        return cmd + self._mpirun_tail() + list(argv)


def find_binary(name, search=()):
    """An executable by explicit path, under any folder of ``search`` (OSU
    installs nest them, e.g. libexec/osu-micro-benchmarks/mpi/pt2pt/standard),
    or on PATH."""
    if os.sep in name and os.access(name, os.X_OK):
        return name
    for root in [s for s in search if s] + [os.environ.get("OSU_DIR", "")]:
        if not root or not os.path.isdir(root):
            continue
        for dirpath, _dirs, files in os.walk(root):
            if name in files and os.access(os.path.join(dirpath, name), os.X_OK):
                return os.path.join(dirpath, name)
    found = shutil.which(name)
    if found:
        return found
    raise RunError(f"{name}: not found under {list(search) or 'OSU_DIR'} nor on PATH")


@dataclass
class Job:
    """One benchmark invocation; ``make(workdir)`` returns (argv, output file or None)."""
    name: str
    kind: str                 # osu | hpl | hpcc | perftest
    argv: list
    ranks: int | None = None
    ranks_per_node: int | None = None
    files: dict = field(default_factory=dict)   # name -> contents written before running
    output_file: str | None = None              # read instead of stdout (hpcc)
    pair: dict | None = None                    # perftest: server, client, rsh and options
    placement: str = "all"                      # inter-host | same-host (2 ranks) | all

    @property
    def tag(self):
        """Unique within a configuration (raw file names)."""
        return self.name if self.placement == "all" else f"{self.name}.{self.placement}"


def osu_job(name, binary=None, search=(), min_size=None, max_size=None, iterations=None,
            warmup=None, window=None, percentiles=None, full=False, validate=False,
            placement=None):
    """An OSU job. ``percentiles``: True for -z, or a list like [95, 99].
    Pair benchmarks need ``placement`` (inter-host or same-host)."""
    if name not in osu.BENCHMARKS:
        raise HarnessError(f"unknown OSU benchmark {name!r}; known: {', '.join(OSU_ALL)}")
    if name in osu.NOT_RUN:
        raise HarnessError(f"{name}: not run by the harness: {osu.NOT_RUN[name]}")
    for flag, wanted in (("-f", full), ("-W", window), ("-c", validate), ("-z", percentiles),
                         ("-i", iterations), ("-x", warmup)):
        if wanted and not osu.accepts(name, flag):
            # OSU prints "Invalid option" and its usage for these: refuse before running
            raise HarnessError(f"{name} has no {flag} in OSU 7.4")
    if not osu.has_sizes(name):
        min_size = max_size = None      # barriers have no message size
    fam = osu.family(name)
    argv = [binary or find_binary(name, search)]
    if fam != osu.STARTUP:
        if min_size is not None and max_size is not None:
            argv += ["-m", f"{min_size}:{max_size}"]
        elif max_size is not None:
            argv += ["-m", str(max_size)]
        elif min_size is not None:
            argv += ["-m", f"{min_size}:"]
        if iterations:
            argv += ["-i", str(iterations)]
        if warmup is not None:
            argv += ["-x", str(warmup)]
        if window:
            argv += ["-W", str(window)]
        if full:
            argv.append("-f")
        if validate:
            argv.append("-c")
        if percentiles:
            argv.append("-z" if percentiles is True else "-z" + ",".join(str(p) for p in percentiles))
    if fam == osu.PAIR:
        if placement not in PLACEMENTS:
            raise HarnessError(f"{name} runs on 2 ranks: give a placement ({', '.join(PLACEMENTS)})")
        return Job(name, "osu", argv, ranks=2, placement=placement)
    return Job(name, "osu", argv)


def pingpong_job(min_size=1, max_size=4096, iterations=1000, warmup=100, percentiles=True,
                 python=None, placement="same-host"):
    """The harness's mpi4py ping-pong (osu_latency format), 2 ranks."""
    argv = [python or sys.executable, "-m", "kvm_sriov_bench.pingpong", "-m",
            f"{min_size}:{max_size}", "-i", str(iterations), "-x", str(warmup)]
    if percentiles:
        argv.append("-z")
    return Job("mpi_pingpong", "osu", argv, ranks=2, placement=placement)


def hpl_job(xhpl=None, ns=None, nb=192, p=None, q=None, ranks=None, mem_bytes_per_node=None,
            nodes=1, fraction=0.8, search=()):
    ranks = ranks or ((p or 1) * (q or 1))
    if p is None or q is None:
        p, q = hpldat.grid(ranks)
    if ns is None:
        mem = mem_bytes_per_node or hpldat.mem_total_bytes()
        ns = [hpldat.size_from_memory(mem, nodes, nb, fraction)]
    return Job("xhpl", "hpl", [xhpl or find_binary("xhpl", search)], ranks=p * q,
               files={"HPL.dat": hpldat.hpl_dat(ns, nb, p, q)})


def hpcc_job(hpcc=None, ns=None, nb=128, p=None, q=None, ranks=None, mem_bytes_per_node=None,
             nodes=1, fraction=0.5):
    ranks = ranks or ((p or 1) * (q or 1))
    if p is None or q is None:
        p, q = hpldat.grid(ranks)
    if ns is None:
        mem = mem_bytes_per_node or hpldat.mem_total_bytes()
        ns = [hpldat.size_from_memory(mem, nodes, nb, fraction)]
    return Job("hpcc", "hpcc", [hpcc or find_binary("hpcc")], ranks=p * q,
               files={"hpccinf.txt": hpldat.hpcc_inf(ns, nb, p, q)}, output_file="hpccoutf.txt")


def perftest_commands(name, server, client, size=None, iterations=None, json_file=None,
                      device=None, extra=(), rsh=("ssh",), search=()):
    """(server argv, client argv) for a perftest pair run over a remote shell.
    ``size`` None sweeps all sizes (-a)."""
    if name not in PERFTEST:
        raise HarnessError(f"unknown perftest {name!r}; known: {', '.join(PERFTEST)}")
    base = [name]
    base += ["-a"] if size is None else ["-s", str(size)]
    if iterations:
        base += ["-n", str(iterations)]
    if device:
        base += ["-d", device]
    base += ["-F"] + list(extra)
    srv = list(rsh) + [server] + base if rsh else base
    cli_base = base + (["--out_json", f"--out_json_file={json_file}"] if json_file else [])
    cli = (list(rsh) + [client] if rsh else []) + cli_base + [server]
    return srv, cli


def run_perftest(name, server, client, workdir, rsh=("ssh",), settle=1.0, timeout=600, **kw):
    """Run a perftest pair; returns the client's stdout."""
    srv_cmd, cli_cmd = perftest_commands(name, server, client, rsh=rsh, **kw)
    srv = subprocess.Popen(srv_cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(settle)
        out = subprocess.run(cli_cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout)
        srv.wait(timeout=60)
    finally:
        if srv.poll() is None:
            srv.kill()
    if out.returncode != 0:
        raise RunError(f"{' '.join(cli_cmd)} exited {out.returncode}: {out.stderr.strip()[-500:]}")
    return out.stdout


def perftest_job(name, server, client, size=None, iterations=None, device=None, rsh=("ssh",)):
    """A perftest pair (not MPI): the server on ``server``, the client on
    ``client`` pointing at it, both started through ``rsh`` (none: locally)."""
    perftest_commands(name, server, client)  # refuses unknown names early
    return Job(name, "perftest", [], pair={"server": server, "client": client, "rsh": tuple(rsh),
                                            "size": size, "iterations": iterations, "device": device})


def execute(job, launcher, workdir, timeout=3600, env=None, on_line=None):
    """Run one job once; returns (exit code, command, raw output text: stdout
    and stderr, or the file the benchmark writes). ``on_line`` sees each
    output line as it comes (progress inside long runs)."""
    os.makedirs(workdir, exist_ok=True)
    if job.kind == "perftest":
        pair = dict(job.pair)
        _, cmd = perftest_commands(job.name, pair["server"], pair["client"], size=pair["size"],
                                   iterations=pair["iterations"], device=pair["device"], rsh=pair["rsh"])
        try:
            return 0, cmd, run_perftest(job.name, pair.pop("server"), pair.pop("client"), workdir,
                                        rsh=pair.pop("rsh"), timeout=timeout, **pair)
        except (RunError, OSError, subprocess.TimeoutExpired) as e:
            return 1, cmd, str(e)
    for fname, content in job.files.items():
        with open(os.path.join(workdir, fname), "w") as f:
            f.write(content)
    if job.output_file:
        try:
            os.unlink(os.path.join(workdir, job.output_file))
        except FileNotFoundError:
            pass
    if job.placement in PLACEMENTS:
        where = launcher.pair(job.placement)
        if where is None:
            raise RunError(f"{job.name}: the nodes {launcher.hosts} cannot hold a {job.placement} pair")
        cmd = launcher.command(job.argv, placement=where)
    else:
        cmd = launcher.command(job.argv, ranks=job.ranks, ranks_per_node=job.ranks_per_node)
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", env=full_env)
    except FileNotFoundError as e:
        raise RunError(f"cannot start {cmd[0]}: {e}") from None
    lines = []

    def read():
        kept = 0
        # at most a piece of a line at a time (a VM may print one without end); past the
        # parsers' bound the output is drained, not kept: the parse then says it is too big
        for line in iter(lambda: proc.stdout.readline(1 << 16), ""):
            if kept <= MAX_INPUT:
                lines.append(line)
                kept += len(line)
            if on_line:
                on_line(line)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RunError(f"{shlex.join(cmd)} did not finish in {timeout}s") from None
    finally:
        reader.join(timeout=10)
    text = "".join(lines)
    if job.output_file:
        path = os.path.join(workdir, job.output_file)
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(MAX_INPUT + 1)
    return proc.returncode, cmd, text


def mpi_version(launcher):
    """First line of the launcher's --version (e.g. "mpirun (Open MPI) 4.1.4"), or ''."""
    if launcher.kind == "none":
        return ""
    try:
        out = subprocess.run([launcher.program or launcher.kind, "--version"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else ""


def run_trials(jobs, launcher, trials, outdir, config, progress=True, timeout=3600,
               keep_going=False, sink=None, first_trial=None, versions=None):
    """Run every job ``trials`` times; save raw outputs under outdir/raw and
    return tidy rows tagged with trial and ``config`` (env, hosts,
    vms_per_host, ppn, label). ``sink(rows)`` gets each finished trial's
    rows at once, so a later failure loses nothing already measured.
    ``first_trial(job)`` numbers the trials (appending to earlier ones);
    ``versions`` (a dict) gets each benchmark's version as it printed it."""
    from .progress import bar
    label = config.get("label") or _label(config)
    rows, errors = [], []
    total = len(jobs) * trials
    with bar(total, f"{label}", enabled=progress) as pb:
        for job in jobs:
            base = first_trial(job) if first_trial else 0
            for k in range(trials):
                t = base + k
                pb.start(f"{job.tag} trial {t}")
                work = os.path.join(outdir, "work", label, job.tag)
                raw = os.path.join(outdir, "raw", label, f"{job.tag}.t{t}.txt")
                os.makedirs(os.path.dirname(raw), exist_ok=True)
                try:
                    rc, cmd, text = execute(job, launcher, work, timeout=timeout,
                                            on_line=lambda line: _watch(line, pb))
                except RunError as e:
                    if not keep_going:
                        raise
                    errors.append(str(e))
                    pb.update(1)
                    continue
                with open(raw, "w") as f:
                    f.write(text)
                try:
                    parsed = parse_text(text, source=raw, kind=job.kind,
                                        benchmark=job.name if job.kind in ("osu", "perftest") else None)
                    if rc != 0:
                        raise RunError(f"{shlex.join(cmd)} exited {rc} (output in {raw})")
                except (ParseError, RunError) as e:
                    if not keep_going:
                        raise
                    errors.append(str(e))
                    pb.update(1)
                    continue
                if versions is not None and parsed.version:
                    versions[job.name] = parsed.version
                new = []
                for r in parsed.rows:
                    row = dict(r)
                    row.pop("line", None)
                    row.update(trial=t, env=config.get("env", "native"), placement=job.placement,
                               hosts=int(config.get("hosts", max(1, len(launcher.hosts)))),
                               vms_per_host=int(config.get("vms_per_host", 0)),
                               ppn=int(config.get("ppn", launcher.ranks_per_node)),
                               label=label, source=os.path.relpath(raw, outdir))
                    new.append(row)
                if sink:
                    sink(new)
                rows += new
                pb.update(1)
    return rows, errors


def _watch(line, pb):
    """Progress inside a run: HPL result lines, OSU sizes, anything else."""
    s = line.strip()
    if s:
        pb.note(s)


def _label(config):
    if config.get("env", "native") == "native":
        return f"native-h{config.get('hosts', 1)}"
    return f"vm-h{config.get('hosts', 1)}-v{config.get('vms_per_host', 1)}"
