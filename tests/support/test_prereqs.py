"""The suites' prerequisites (dev-tools/programs.py, rakelib/support.rb): every
program a suite starts is found and named with its package, a missing one is one
line, and the closing summary names a suite whose own set-up failed."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "dev-tools"))
import programs  # noqa: E402


def test_the_simulated_hosts_sshd_and_ip_are_found():
    found = programs.scan(["simhost/libvirt_host.py"])
    assert found["/usr/sbin/sshd"] == "certain"
    assert found["ip"] == "certain"
    assert {"virtlogd", "libvirtd"} <= set(found)       # in the daemons' shell script


def test_scan_reads_commands_not_docstrings_xml_or_config(tmp_path):
    (tmp_path / "m.py").write_text(textwrap.dedent('''
        """Run it with frobnicate --all."""
        import subprocess
        CONF = "[network]\\nbridge = 'a:b'\\n"
        XML = """<domain>
          <serial type='file'/>
        </domain>"""
        subprocess.run(["wibble", "-x"])
        subprocess.run(['nsenter', '-t', '1'] + ["x"])
        SCRIPT = "set -e\\nmodprobe vfio\\n"
    '''))
    found = programs.scan([str(tmp_path / "m.py")])
    assert found == {"wibble": "certain", "nsenter": "certain", "modprobe": "maybe"}


def test_a_missing_program_is_one_line_with_its_package(tmp_path, monkeypatch, capsys):
    (tmp_path / "m.py").write_text('import subprocess\nsubprocess.run(["/usr/sbin/sshd", "-D"])\n')
    monkeypatch.setattr(programs, "locate", lambda prog: None)
    assert programs.require([], [str(tmp_path / "m.py")]) == 1
    assert capsys.readouterr().out == "missing /usr/sbin/sshd: apt-get install openssh-server\n"


def test_lint_names_the_package_a_suite_forgot(tmp_path, capsys):
    (tmp_path / "m.py").write_text('import subprocess\nsubprocess.run(["/usr/sbin/sshd", "-D"])\n')
    suites = {"s": {"packages": ["python3-pytest"], "code": [str(tmp_path / "m.py")]}}
    assert programs.lint(suites) == 1
    assert "s: starts /usr/sbin/sshd from package openssh-server, which the suite does not declare" \
        in capsys.readouterr().out
    suites["s"]["packages"].append("openssh-server")
    assert programs.lint(suites) == 0


def _summary(tmp_path, logs: dict) -> subprocess.CompletedProcess:
    """rake's run_suites over suites whose logs say what is given."""
    script = textwrap.dedent(f'''
        require 'rake'
        require {str(REPO / "rakelib" / "support.rb")!r}
        Support.send(:remove_const, :BUILD)
        Support.const_set(:BUILD, {str(tmp_path)!r})
        logs = {json.dumps(logs)}
        list = logs.keys.each_with_index.map do |name, i|
          Support::Suite.new(name, i, name, lambda do |n|
            Support.logged(n, 'printf', '%s', logs[n])
            !logs[n].include?('failed') && !logs[n].include?('error')
          end)
        end
        Support.run_suites(list)
    ''')
    return subprocess.run(["ruby", "-e", script], capture_output=True, text=True, cwd=REPO)


def test_summary_gives_the_wall_time_and_names_a_failed_set_up(tmp_path):
    p = _summary(tmp_path, {
        "good": "3 passed in 1.00s\n",
        "broken": "_____ ERROR at setup of test_x _____\nE   RuntimeError: oned did not start\n"
                  "1 passed, 5 errors in 3.00s\n",
        "bad": "FAILED tests/t.py::test_y - AssertionError: {1: 2}\n2 failed, 1 passed in 1.00s\n",
    })
    lines = {line.split()[0]: line for line in p.stdout.splitlines() if line[:1].isalpha()}
    assert p.returncode != 0
    assert " ok " in lines["good"]
    assert "SETUP FAILED" in lines["broken"]
    assert " FAIL " in lines["bad"] and "SETUP" not in lines["bad"]
    assert "wall time" in lines["total"]
    # each failed suite's reasons under the table (a long log is cut in its middle)
    why = p.stdout.split("=== what failed ===")[1]
    assert "- broken, its log " in why and "- bad, its log " in why and "- good" not in why
    assert "    FAILED tests/t.py::test_y - AssertionError: {1: 2}" in why
    assert p.stdout.rstrip().splitlines()[-1] == "5 passed, 7 failed"


def test_a_simulated_host_without_sshd_says_what_to_install(tmp_path, monkeypatch):
    import pytest
    from simhost import libvirt_host, prereq
    real = prereq.locate
    monkeypatch.setattr(prereq, "locate", lambda p: None if p == "/usr/sbin/sshd" else real(p))
    host = libvirt_host.LibvirtHost("h1", tmp_path, ip="10.99.0.1")
    with pytest.raises(prereq.MissingProgram, match=r"^missing /usr/sbin/sshd: apt-get install openssh-server$"):
        host.start()
    assert not (tmp_path / "h1").exists()          # nothing made before the check


def test_a_daemon_script_hitting_exit_127_names_the_program():
    import pytest
    from simhost import libvirt_host, prereq
    with pytest.raises(prereq.MissingProgram, match=r"^missing /usr/sbin/no-such-daemon: "):
        libvirt_host._start_under_reaper(["sh", "-c", "/usr/sbin/no-such-daemon -d"])


def test_a_run_leaves_the_logs_of_suites_it_does_not_run(tmp_path):
    (tmp_path / "test-logs").mkdir()
    (tmp_path / "test-logs" / "other.log").write_text("written by a run going on\n")
    (tmp_path / "test-logs" / "good.log").write_text("stale\n")
    _summary(tmp_path, {"good": "3 passed in 1.00s\n"})
    assert (tmp_path / "test-logs" / "other.log").exists()
    assert "stale" not in (tmp_path / "test-logs" / "good.log").read_text()


def test_the_stock_scripts_ruby_needs_nothing_outside_the_simulated_nodes_remotes(tmp_path):
    """OpenNebula's load_opennebula_paths.rb makes one gem folder Ruby's only one; a
    simulated node's is next to its remotes (with the rexml the stock scripts load),
    never /usr/share/one/gems, which a front-end links machine-wide or nothing has."""
    from simhost import stock_kvm
    lib = stock_kvm.install(tmp_path / "var" / "tmp" / "one")
    env = {"PATH": "/usr/bin:/bin", **stock_kvm.environment(lib)}
    p = subprocess.run(["ruby", "-e", 'require "load_opennebula_paths"; require "rexml/document"; puts Gem.path'],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(tmp_path / "var" / "tmp" / "one-gems")]
    # datastore/xpath.rb (save, restore) names the node's folder itself before loading it
    p = subprocess.run(["ruby", "-e", 'GEMS_LOCATION ||= "/usr/share/one/gems"; require "load_opennebula_paths"; '
                        'puts Gem.path'], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(tmp_path / "var" / "tmp" / "one-gems")]
    remotes = tmp_path / "var" / "tmp" / "one"
    p = subprocess.run(["ruby", str(remotes / "datastore" / "xpath.rb"), "--stdin", "/VM/ID"], env=env,
                       input="<VM><ID>7</ID></VM>", capture_output=True, text=True)
    assert (p.returncode, p.stderr) == (0, ""), p.stderr


def test_a_nested_lane_suite_runs_beside_the_others_and_benches_after_both(tmp_path):
    """`rake test`'s lanes: a nested-lane suite overlaps the others (2 s beside
    5 s in well under 7 s), its output comes as one block, a bench starts only
    once both lanes are done, and a bench declared `lane: :main` runs in the
    first lane (beside the nested one)."""
    script = textwrap.dedent(f'''
        require 'rake'
        require {str(REPO / "rakelib" / "support.rb")!r}
        Support.send(:remove_const, :BUILD)
        Support.const_set(:BUILD, {str(tmp_path)!r})
        def Support.shared_builds(_list); end
        stamp = ->(n, what) {{ File.write(File.join({str(tmp_path)!r}, "#{{n}}.#{{what}}"), Time.now.to_f.to_s) }}
        run = lambda do |n|
          stamp.(n, 'start')
          # the nested suite outlasts fast + bench-ratio, so their order is not a race
              secs = n == 'nested' ? 5 : 2
              ok = Support.logged(n, 'sh', '-c', "echo #{{n}} one; sleep #{{secs}}; echo #{{n}} two; echo '1 passed in 2.00s'")
          stamp.(n, 'end')
          ok
        end
        list = [Support::Suite.new('fast', 1, 'fast', run),
                Support::Suite.new('nested', 2, 'nested', run, nil, [], [], :beside),
                Support::Suite.new('bench-x', 3, 'bench', run),
                Support::Suite.new('bench-ratio', 2.5, 'ratio', run, nil, [], [], :main)]
        Support.run_suites(list, all: true)
    ''')
    p = subprocess.run(["ruby", "-e", script], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    t = {f.name: float(f.read_text()) for f in tmp_path.glob("*.start")} | \
        {f.name: float(f.read_text()) for f in tmp_path.glob("*.end")}
    assert t["nested.start"] < t["fast.end"]                              # beside each other
    assert t["bench-x.start"] >= max(t["fast.end"], t["nested.end"])     # quiet machine
    assert t["bench-ratio.start"] < t["nested.end"]                       # first lane
    assert t["fast.end"] <= t["bench-ratio.start"]                        # in its order there
    out = p.stdout
    assert out.index("nested one") + len("nested one\n") == out.index("nested two")  # one block
    assert "4 passed, 0 failed" in out and "second lane" in out
