"""kvm-sriov-bench: VM / bare-metal efficiency harness.

    kvm-sriov-bench run --hosts n1,n2 --osu osu_latency,osu_bw --hpl --trials 5 --out res
    kvm-sriov-bench opennebula --endpoint URL --template 12 --hosts n1,n2 \
        --vms-per-host 1,2,4,7 --osu osu_multi_lat,osu_mbw_mr --trials 5 --out res
    kvm-sriov-bench opennebula --service my-cluster --osu osu_latency --trials 5 --out res
    kvm-sriov-bench analyze res            # summary.csv/json, efficiency.csv/json
    kvm-sriov-bench report res             # PNGs + report.html + report.md
    kvm-sriov-bench reproduce-paper --out paper002
    kvm-sriov-bench parse FILE...          # tidy rows, or a clear error
    kvm-sriov-bench hpl-dat --ranks 4      # HPL.dat sized from memory
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import sys
import time

from . import analysis, hpldat, names, osu
from .errors import HarnessError


def _csv_list(s):
    return [x for x in (s or "").split(",") if x]


def _int_list(s):
    return [int(x) for x in _csv_list(s)]


def _suite_args(p):
    g = p.add_argument_group("suite")
    g.add_argument("--osu", type=_csv_list, default=[], help="OSU benchmarks, e.g. osu_latency,osu_bw "
                   f"(known: {','.join(osu.RUNNABLE)})")
    g.add_argument("--osu-dir", action="append", default=[], help="where OSU binaries are (searched recursively)")
    g.add_argument("--min-size", type=int)
    g.add_argument("--max-size", type=int)
    g.add_argument("--iterations", type=int)
    g.add_argument("--warmup", type=int)
    g.add_argument("--window", type=int, help="-W for osu_bw/osu_bibw/osu_mbw_mr")
    g.add_argument("--percentiles", nargs="?", const="default", help="OSU -z (or -z95,99 with a list)")
    g.add_argument("--full", action="store_true", help="OSU -f (collectives only)")
    g.add_argument("--validate", action="store_true", help="OSU -c (check the data received)")
    g.add_argument("--placement", default="auto",
                   help="2-rank benchmarks: inter-host, same-host, or both comma-separated "
                        "(default auto: every placement the nodes allow)")
    g.add_argument("--pingpong", action="store_true", help="the harness's mpi4py ping-pong (osu_latency format)")
    g.add_argument("--hpl", action="store_true", help="standalone xhpl")
    g.add_argument("--xhpl", help="path to xhpl")
    g.add_argument("--hpcc", action="store_true", help="Debian's hpcc")
    g.add_argument("--perftest", action="append", default=[], choices=names.PERFTEST,
                   help="perftest pair (repeatable): server on the first host, client on the second")
    g.add_argument("--perftest-size", type=int, help="message size (default: all sizes, -a)")
    g.add_argument("--ib-device", help="perftest -d (e.g. mlx5_0)")
    g.add_argument("--rsh", default="ssh", help="how perftest reaches the hosts ('none': run locally)")
    g.add_argument("--hpl-n", type=_int_list, help="HPL N list (default: sized from memory)")
    g.add_argument("--nb", type=int, help="HPL NB (default 192 xhpl, 128 hpcc)")
    g.add_argument("--pq", help="HPL grid PxQ, e.g. 2x4 (default: most square)")
    g.add_argument("--mem-per-node", type=float, help="GiB per node for sizing N (default: this machine's)")
    g.add_argument("--mem-fraction", type=float, default=None)
    g.add_argument("--trials", type=int, default=3)
    g.add_argument("--out", required=True, help="results folder (samples.csv is appended to)")
    g.add_argument("--keep-going", action="store_true", help="record failed trials and continue")
    g.add_argument("--timeout", type=int, default=3600, help="seconds per benchmark run")
    g.add_argument("--no-progress", action="store_true")
    l = p.add_argument_group("launcher")
    l.add_argument("--launcher", choices=("mpirun", "srun", "none"), default="mpirun")
    l.add_argument("--mpirun", help="path to mpirun/srun")
    l.add_argument("--ppn", type=int, default=1, help="ranks per node (per VM in VM runs)")
    l.add_argument("--bind", default="core", help="binding: core, socket, none")
    l.add_argument("--oversubscribe", action="store_true")
    l.add_argument("--mpi-arg", action="append", default=[], help="extra launcher argument (repeatable)")
    l.add_argument("-x", "--env", action="append", default=[], help="VAR=value exported to ranks")


def _placements(a, launcher):
    """The placements to run 2-rank benchmarks in; refuses one the nodes cannot hold."""
    if a.placement == "auto":
        return [p for p in names.PLACEMENTS if launcher.pair(p) is not None]
    wanted = _csv_list(a.placement)
    for p in wanted:
        if p not in names.PLACEMENTS:
            raise HarnessError(f"--placement {p}: one of {', '.join(names.PLACEMENTS)}")
        if launcher.pair(p) is None:
            raise HarnessError(f"--placement {p}: the nodes {launcher.hosts or ['this machine']} "
                               "cannot hold it (inter-host needs 2 hosts; same-host in VMs needs "
                               "2 VMs on one host)")
    return wanted


def _jobs(a, launcher, nodes):
    from . import runners
    jobs = []
    pct = None
    if a.percentiles:
        pct = True if a.percentiles == "default" else _int_list(a.percentiles)
    placements = _placements(a, launcher)
    known = [n for n in a.osu if n in osu.BENCHMARKS]
    for opt, given in (("-f", a.full), ("-W", a.window), ("-c", a.validate)):
        if given and known and not any(osu.accepts(n, opt) for n in known):
            # OSU would print "Invalid option" for every one of them
            raise HarnessError(f"{opt}: none of {', '.join(known)} takes it in OSU 7.4")
    for name in a.osu:
        kw = dict(search=a.osu_dir, min_size=a.min_size, max_size=a.max_size,
                  iterations=a.iterations, warmup=a.warmup, window=a.window, percentiles=pct,
                  full=a.full, validate=a.validate)
        if name in osu.BENCHMARKS:
            # suite-wide options go to the benchmarks that take them (OSU refuses the rest)
            for opt, key in (("-f", "full"), ("-W", "window"), ("-c", "validate"), ("-z", "percentiles"),
                             ("-i", "iterations"), ("-x", "warmup")):
                if not osu.accepts(name, opt):
                    kw[key] = None
        if name in osu.BENCHMARKS and osu.family(name) == osu.PAIR:
            jobs += [runners.osu_job(name, placement=p, **kw) for p in placements]
        else:
            jobs.append(runners.osu_job(name, **kw))
    if a.pingpong:
        for p in placements:
            jobs.append(runners.pingpong_job(min_size=a.min_size or 1, max_size=a.max_size or 4096,
                                             iterations=a.iterations or 1000,
                                             warmup=a.warmup if a.warmup is not None else 100,
                                             placement=p))
    p = q = None
    if a.pq:
        p, q = (int(x) for x in a.pq.lower().split("x"))
    mem = int(a.mem_per_node * 2 ** 30) if a.mem_per_node else None
    ranks = launcher.total_ranks()
    if a.hpl:
        jobs.append(runners.hpl_job(xhpl=a.xhpl, ns=a.hpl_n, nb=a.nb or 192, p=p, q=q, ranks=ranks,
                                    mem_bytes_per_node=mem, nodes=nodes, fraction=a.mem_fraction or 0.8))
    if a.hpcc:
        jobs.append(runners.hpcc_job(ns=a.hpl_n, nb=a.nb or 128, p=p, q=q, ranks=ranks,
                                     mem_bytes_per_node=mem, nodes=nodes, fraction=a.mem_fraction or 0.5))
    if a.perftest:
        hosts = list(launcher.hosts) or ["localhost"]
        server, client = hosts[0], hosts[1] if len(hosts) > 1 else hosts[0]
        rsh = () if a.rsh == "none" else tuple(a.rsh.split())
        for name in a.perftest:
            jobs.append(runners.perftest_job(name, server, client, size=a.perftest_size,
                                             iterations=a.iterations, device=a.ib_device, rsh=rsh))
    if not jobs:
        raise HarnessError("nothing to run: give --osu, --pingpong, --hpl, --hpcc or --perftest")
    return jobs


def _launcher(a, hosts, hostfile=None):
    from . import runners
    env = dict(kv.split("=", 1) for kv in a.env)
    return runners.Launcher(kind=a.launcher, program=a.mpirun, hosts=hosts, ranks_per_node=a.ppn,
                            bind=None if a.bind == "none" else a.bind, hostfile=hostfile,
                            extra=a.mpi_arg, env=env, oversubscribe=a.oversubscribe)


class SampleFile:
    """samples.csv, appended to as each trial finishes. Trials of a
    configuration already in the file are continued, not renumbered from 0
    (a warning says so); a file written with other columns is refused."""

    def __init__(self, out):
        os.makedirs(out, exist_ok=True)
        self.out = out
        self.path = os.path.join(out, "samples.csv")
        self.last = {}          # (label, job tag) -> highest trial in the file
        if os.path.exists(self.path) and os.path.getsize(self.path):
            with open(self.path, newline="") as f:
                reader = csv.reader(f)
                header = next(reader)
                if header != analysis.SAMPLE_FIELDS:
                    raise HarnessError(f"{self.path} has columns {','.join(header)}; this harness "
                                       f"writes {','.join(analysis.SAMPLE_FIELDS)}: use a new --out")
                src = header.index("source")
                for row in reader:
                    m = re.match(r"(.*)\.t(\d+)\.txt$", os.path.basename(row[src]))
                    if not m:
                        continue
                    key = (os.path.basename(os.path.dirname(row[src])), m.group(1))
                    trial = int(m.group(2))
                    if trial > self.last.get(key, -1):
                        self.last[key] = trial
        self.count = 0

    def first_trial(self, label):
        def first(job):
            last = self.last.get((label, job.tag))
            if last is None:
                return 0
            print(f"warning: {self.path} already has trials 0-{last} of {job.tag} ({label}); "
                  f"the new ones are numbered from {last + 1}", file=sys.stderr)
            return last + 1
        return first

    def append(self, rows):
        new = not os.path.exists(self.path) or not os.path.getsize(self.path)
        with open(self.path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=analysis.SAMPLE_FIELDS, extrasaction="ignore",
                               restval="")
            if new:
                w.writeheader()
            w.writerows(rows)
        self.count += len(rows)

    def run_meta(self, meta):
        """One line per run in runs.jsonl: what the report's run table shows."""
        with open(os.path.join(self.out, "runs.jsonl"), "a") as f:
            f.write(json.dumps(meta, sort_keys=True) + "\n")

    def errors(self, errors):
        if errors:
            with open(os.path.join(self.out, "errors.log"), "a") as f:
                f.write("\n".join(errors) + "\n")


def _run(a, jobs, launcher, config, samples):
    from . import runners
    label = config.get("label") or runners._label(config)
    versions = {}
    meta = dict(config, label=label, date=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                command=" ".join(shlex.quote(x) for x in ["kvm-sriov-bench"] + sys.argv[1:]),
                hosts_list=list(launcher.hosts), mpi=runners.mpi_version(launcher),
                versions=versions, trials=a.trials)
    try:
        rows, errors = runners.run_trials(jobs, launcher, a.trials, a.out, config,
                                          progress=not a.no_progress, timeout=a.timeout,
                                          keep_going=a.keep_going, sink=samples.append,
                                          first_trial=samples.first_trial(label), versions=versions)
    except HarnessError as e:
        samples.run_meta(dict(meta, failed=str(e)))
        if samples.count:
            raise HarnessError(f"{e}\n(the {samples.count} values of the trials that finished "
                               f"are in {samples.path})") from None
        raise
    samples.errors(errors)
    samples.run_meta(meta)
    return rows, errors


def cmd_run(a):
    hosts = _csv_list(a.hosts)
    launcher = _launcher(a, hosts)
    jobs = _jobs(a, launcher, max(1, len(hosts)))
    config = {"env": a.env_kind, "hosts": max(1, len(hosts)), "vms_per_host": a.vms_per_host if a.env_kind == "vm" else 0,
              "ppn": a.ppn}
    samples = SampleFile(a.out)
    rows, errors = _run(a, jobs, launcher, config, samples)
    print(f"{len(rows)} samples from {len(jobs)} benchmark(s) x {a.trials} trial(s) -> {samples.path}"
          + (f"; {len(errors)} failed trial(s), see errors.log" if errors else ""))
    return 0


def _session(a):
    if a.session:
        return a.session
    if os.environ.get("ONE_AUTH") and os.path.exists(os.environ["ONE_AUTH"]):
        return open(os.environ["ONE_AUTH"]).read().strip()
    auth = os.path.expanduser("~/.one/one_auth")
    if os.path.exists(auth):
        return open(auth).read().strip()
    raise HarnessError("no OpenNebula session: give --session user:password or set ONE_AUTH")


def cmd_opennebula(a):
    from . import runners
    from .opennebula import OneCluster
    endpoint = a.endpoint or os.environ.get("ONE_XMLRPC") or "http://localhost:2633/RPC2"
    if (a.service is None) == (a.template is None):
        raise HarnessError("give --template (VMs made for the run) or --service (a OneFlow service's VMs)")
    if a.service is not None:
        if a.hosts or a.paper_configs or a.vms_per_host:
            raise HarnessError("--service takes the service's VMs where they are: no --hosts, "
                               "--vms-per-host or --paper-configs")
        return _service_run(a, endpoint)
    if a.role:
        raise HarnessError("--role is for --service")
    one = OneCluster.connect(endpoint, _session(a))
    hosts = _csv_list(a.hosts)
    if not hosts:
        raise HarnessError("--template needs --hosts")
    if a.paper_configs:
        configs = [(h, v) for h, v in runners.paper_configs() if h <= len(hosts)]
    else:
        configs = [(len(hosts), v) for v in (_int_list(a.vms_per_host) or [1])]
    if not configs:
        raise HarnessError("no configuration fits the given hosts")
    samples = SampleFile(a.out)
    for nhosts, vph in configs:
        use = hosts[:nhosts]
        print(f"== {nhosts} hosts x {vph} VMs/host: instantiating template {a.template}", flush=True)
        with OneCluster(one, a.template, use, vph, timeout=a.vm_timeout, progress=not a.no_progress,
                        ib_attr=None if a.no_ib_wait else "IB_STATE") as cluster:
            _run_on_vms(a, cluster.vms, nhosts, vph, samples, slots=a.ppn)
            print("   terminating VMs", flush=True)
    return 0


def _run_on_vms(a, vms, nhosts, vph, samples, slots=None, meta=None):
    """The suite on VMs that are ready: hostfile, launcher, trials."""
    label = f"vm-h{nhosts}-v{vph}"
    hf = os.path.join(a.out, "hostfiles", f"{label}.txt")
    os.makedirs(os.path.dirname(hf), exist_ok=True)
    from .opennebula import hostfile
    text = hostfile(vms, slots=slots)   # refuses a VM that is not one host line before anything is written
    with open(hf, "w") as f:
        f.write(text)
    print(f"   hostfile {hf}: " + ", ".join(vm.ipoib for vm in vms), flush=True)
    vm_hosts = [vm.ipoib for vm in vms]
    if a.launch_locally:
        launcher = _launcher(a, [])
        launcher.ranks_per_node = a.ppn * len(vm_hosts)
    else:
        launcher = _launcher(a, vm_hosts, hostfile=hf if a.launcher == "mpirun" else None)
        launcher.host_of = {vm.ipoib: vm.host for vm in vms}
    jobs = _jobs(a, launcher, len(vm_hosts))
    config = dict(meta or {}, env="vm", hosts=nhosts, vms_per_host=vph, ppn=a.ppn, label=label)
    rows, _errors = _run(a, jobs, launcher, config, samples)
    print(f"   {len(rows)} samples -> {samples.path}", flush=True)
    return rows


def _service_run(a, endpoint):
    """A OneFlow service as the target: its VMs where they run, left running."""
    from .oneflow import DEFAULT_URL, OneFlow
    from .opennebula import OneCluster, ServiceTarget, outage_text
    session = _session(a)
    flow = OneFlow(a.oneflow or os.environ.get("ONEFLOW_URL") or DEFAULT_URL, session)
    one = OneCluster.connect(endpoint, session)
    roles = _csv_list(",".join(a.role))
    print(f"== service {a.service}" + (f" (roles {', '.join(roles)})" if roles else "")
          + f": waiting for RUNNING at {flow.url}", flush=True)
    target = ServiceTarget(one, flow, a.service, roles=roles, timeout=a.vm_timeout,
                           progress=not a.no_progress, ib_attr=None if a.no_ib_wait else "IB_STATE")
    vms = target.wait_ready()
    svc, hosts = target.service, target.hosts
    per_host = [sum(1 for vm in vms if vm.host == h) for h in hosts]
    vph = max(per_host)
    if len(set(per_host)) > 1:
        print(f"warning: the service's VMs are spread unevenly ({', '.join(f'{h}: {n}' for h, n in zip(hosts, per_host))}); "
              f"rows are labelled {vph} VMs/host", file=sys.stderr)
    print(f"   {svc.describe(hosts)}", flush=True)
    for vm in vms:
        if vm.ib_outage_seconds is not None:
            print(f"   VM {vm.id} ({vm.role} on {vm.host}): {outage_text(vm)}", flush=True)
    meta = {"target": svc.describe(hosts),
            "service": {"id": svc.id, "name": svc.name, "roles": {r: svc.roles[r] for r in (roles or svc.roles)},
                        "vms": [_vm_meta(vm) for vm in vms],
                        "hosts": hosts}}
    _run_on_vms(a, vms, len(hosts), vph, SampleFile(a.out), meta=meta)
    print(f"   service {svc.id} left running (it is not the harness's)", flush=True)
    return 0


def _vm_meta(vm):
    meta = {"id": vm.id, "role": vm.role, "host": vm.host, "ipoib": vm.ipoib, "vcpu": vm.vcpu}
    if vm.ib_outage_seconds is not None:
        meta.update(ib_outage_seconds=vm.ib_outage_seconds, ib_outage_ended=vm.ib_outage_ended)
    return meta


def _load_samples(paths):
    files = []
    for p in paths:
        files.append(os.path.join(p, "samples.csv") if os.path.isdir(p) else p)
    from . import samplefile
    return samplefile.read(files)


def cmd_analyze(a):
    t0 = time.perf_counter()
    s = _load_samples(a.samples)
    t1 = time.perf_counter()
    summary, eff = analysis.analyze(s, alpha=a.alpha)
    t2 = time.perf_counter()
    out = a.out or (a.samples[0] if os.path.isdir(a.samples[0]) else os.path.dirname(a.samples[0]) or ".")
    os.makedirs(out, exist_ok=True)
    meta = {"samples": len(s), "test": analysis.TEST_NAME, "alpha": a.alpha,
            "efficiency": "VM/native (higher is better), native/VM (latency)"}
    analysis.write_csv(os.path.join(out, "summary.csv"), summary, analysis.SUMMARY_FIELDS)
    analysis.write_json(os.path.join(out, "summary.json"), summary, meta)
    analysis.write_csv(os.path.join(out, "efficiency.csv"), eff, analysis.EFFICIENCY_FIELDS)
    analysis.write_json(os.path.join(out, "efficiency.json"), eff, meta)
    print(f"{len(s)} samples (read {t1 - t0:.2f}s, analysed {t2 - t1:.2f}s): "
          f"{len(summary)} summary rows, {len(eff)} efficiency rows -> {out}")
    for e in eff:
        if e["statistic"] == "mean" and e["reported"] in ("avg", "value", "overall"):
            print(f"  {e['benchmark']:<16} {e['metric']:<12} size {e['size']:>8}  "
                  f"{e['hosts']} hosts x {e['vms_per_host']} VMs {e['placement']}"
                  f"{' ' + e['params'] if e['params'] else ''}: {e['efficiency'] * 100:7.2f} %"
                  f"  {analysis.p_text(e)}")
    return 0


def cmd_report(a):
    from . import report
    summary = analysis.read_rows(os.path.join(a.results, "summary.csv"))
    eff = analysis.read_rows(os.path.join(a.results, "efficiency.csv"))
    runs = []
    meta = os.path.join(a.results, "runs.jsonl")
    if os.path.exists(meta):
        with open(meta) as f:
            runs = [json.loads(line) for line in f if line.strip()]
    paths = report.render(summary, eff, a.out or os.path.join(a.results, "report"), title=a.title,
                          runs=runs)
    print(f"report: {paths['html']}, {paths['markdown']}, {len(paths['figures'])} figure(s)")
    return 0


def cmd_reproduce(a):
    from . import paper
    rows, checks, paths = paper.reproduce(a.out, path=a.data or paper.DATA)
    print("Paper 002, Table I (latency efficiency = hosts / VMs):")
    for c in checks:
        print(f"  {c['size']:>4} B: {c['hosts_us']} / {c['vms_us']} us = {c['computed_pct']:.3f} %  "
              f"published {c['published_pct']} %  {'OK' if c['ok'] else 'MISMATCH'}")
    print("Stated in the text (approximate): " + "; ".join(
        f"{r['benchmark']} {r['hosts']} hosts x {r['vms_per_host']} VMs ~{r['efficiency'] * 100:.0f} %"
        for r in rows if r["reported"] == "stated" and r["benchmark"] == "hpl"))
    print(f"report: {paths['html']}, {paths['markdown']}, {len(paths['figures'])} figure(s)")
    return 0 if all(c["ok"] for c in checks) else 1


def cmd_parse(a):
    from .parsers import parse_file
    status = 0
    out = []
    for path in a.files:
        try:
            p = parse_file(path, kind=a.kind)
        except HarnessError as e:
            print(f"error: {e}", file=sys.stderr)
            status = 2
            continue
        for r in p.rows:
            out.append(dict(r, file=path, version=p.version))
    if a.json:
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        w = csv.DictWriter(sys.stdout, fieldnames=["file", "benchmark", "version", "metric", "reported",
                                                   "unit", "size", "value", "line"])
        w.writeheader()
        w.writerows(out)
    return status


def cmd_hpl_dat(a):
    ranks = a.ranks or (a.p * a.q if a.p and a.q else 1)
    p, q = (a.p, a.q) if a.p and a.q else hpldat.grid(ranks)
    ns = a.n
    if not ns:
        mem = int(a.mem_per_node * 2 ** 30) if a.mem_per_node else hpldat.mem_total_bytes()
        ns = [hpldat.size_from_memory(mem, a.nodes, a.nb, a.fraction)]
    text = (hpldat.hpcc_inf if a.hpcc else hpldat.hpl_dat)(ns, a.nb, p, q)
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def build_parser():
    ap = argparse.ArgumentParser(prog="kvm-sriov-bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="run a suite on bare metal (or inside VMs you made yourself)")
    p.add_argument("--hosts", default="", help="comma-separated hosts ([] = this machine)")
    p.add_argument("--env-kind", "--kind", dest="env_kind", choices=("native", "vm"), default="native")
    p.add_argument("--vms-per-host", type=int, default=1, help="label for --kind vm")
    _suite_args(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("opennebula", help="VMs through OpenNebula, same suite, terminate")
    p.add_argument("--endpoint", help="XML-RPC endpoint (default $ONE_XMLRPC)")
    p.add_argument("--session", help="user:password (default $ONE_AUTH, ~/.one/one_auth)")
    p.add_argument("--template", type=int, help="VM template ID (VMs made for the run, then terminated)")
    p.add_argument("--hosts", help="OpenNebula host names (with --template)")
    p.add_argument("--vms-per-host", help="list, e.g. 1,2,4,7 (default 1)")
    p.add_argument("--paper-configs", action="store_true", help="2 and 8 hosts x 1,2,4,7 VMs/host")
    p.add_argument("--service", help="a OneFlow service (ID or name): its VMs, left running")
    p.add_argument("--role", action="append", default=[],
                   help="with --service: only this role's VMs (repeatable or comma-separated)")
    p.add_argument("--oneflow", help="OneFlow URL (default $ONEFLOW_URL, else http://localhost:2474)")
    p.add_argument("--no-ib-wait", action="store_true",
                   help="do not wait for the guests to report IB_STATE=ACTIVE")
    p.add_argument("--vm-timeout", type=int, default=900)
    p.add_argument("--launch-locally", action="store_true",
                   help="run the ranks on this machine (dry runs against a stand-in oned)")
    _suite_args(p)
    p.set_defaults(func=cmd_opennebula)
    p = sub.add_parser("analyze", help="statistics, efficiency and t-tests from samples.csv")
    p.add_argument("samples", nargs="+", help="results folders or samples CSV files")
    p.add_argument("--out")
    p.add_argument("--alpha", type=float, default=0.05)
    p.set_defaults(func=cmd_analyze)
    p = sub.add_parser("report", help="figures + HTML + Markdown from an analysed folder")
    p.add_argument("results")
    p.add_argument("--out")
    p.add_argument("--title", default="VM / bare-metal efficiency")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("reproduce-paper", help="paper 002's efficiency table and figures from its numbers")
    p.add_argument("--out", default="paper002")
    p.add_argument("--data", help="paper data JSON (default: the packaged one)")
    p.set_defaults(func=cmd_reproduce)
    p = sub.add_parser("parse", help="parse benchmark outputs into tidy rows")
    p.add_argument("files", nargs="+")
    p.add_argument("--kind", choices=("osu", "hpl", "hpcc", "perftest", "perftest-json"))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_parse)
    p = sub.add_parser("hpl-dat", help="write HPL.dat (or hpccinf.txt)")
    p.add_argument("--n", type=_int_list)
    p.add_argument("--nb", type=int, default=192)
    p.add_argument("--p", type=int)
    p.add_argument("--q", type=int)
    p.add_argument("--ranks", type=int)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--mem-per-node", type=float, help="GiB")
    p.add_argument("--fraction", type=float, default=0.8)
    p.add_argument("--hpcc", action="store_true")
    p.add_argument("-o", "--output")
    p.set_defaults(func=cmd_hpl_dat)
    return ap


def main(argv=None):
    a = build_parser().parse_args(argv)
    try:
        return a.func(a)
    except HarnessError as e:
        print(f"kvm-sriov-bench: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
