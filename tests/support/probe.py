"""The host monitoring probe run as OpenNebula runs it (its own process, a
config naming the fake sysfs), and its output parsed back with a parser of
OpenNebula's template syntax."""

import os
import re
import subprocess

from tests.conftest import REPO

PROBE = REPO / "im/kvm-probes.d/host/system/kvm_sriov.py"
PAIR = re.compile(r'\s*([A-Z0-9_]+)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?\s*')


def parse(text):
    """OpenNebula template text -> {KEY: value or [dict, ...]} (vectors repeat)."""
    out, lines, i = {}, text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        key, _, rest = (p.strip() for p in line.partition("="))
        if rest.startswith("["):
            body = rest[1:]
            while not body.rstrip().endswith("]"):
                i += 1
                body += "\n" + lines[i]
            fields = dict(PAIR.findall(body.rstrip()[:-1]))
            out.setdefault(key, []).append(fields)
        else:
            assert key and re.fullmatch(r'"(?:[^"\\]|\\.)*"|-?\d+', rest), line
            out[key] = rest[1:-1] if rest.startswith('"') else rest
        i += 1
    return out


def run_probe(tmp_path, root, **extra):
    conf = tmp_path / "probe.toml"
    body = f'[sysfs]\nroot = "{root}"\n[pool]\nstate_dir = "{tmp_path / "state"}"\n'
    conf.write_text(body + "".join(f"{k}\n" for k in extra.get("lines", [])))
    done = subprocess.run([str(PROBE)], capture_output=True, text=True,
                          env=dict(os.environ, KVM_SRIOV_CONFIG=str(conf)), timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return parse(done.stdout)
