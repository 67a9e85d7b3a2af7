"""A stand-in for OpenNebula's monitord-client.rb, for the tests of the signal
that makes it run the system probes again (kvm_sriov/node/monitor.py): its
command line names monitord-client.rb, each SIGUSR1 is counted in the file its
first argument names (one run of the probes each), and with a third argument
it has a child whose command line ends with that argument (a system probe running)."""

CLIENT = """
import signal, sys, time
count = 0
def probe(*_):
    global count
    count += 1
    open(sys.argv[1], "w").write(str(count))
signal.signal(signal.SIGUSR1, probe)
if len(sys.argv) > 3:   # busy: one of its system probes is running
    import subprocess
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", sys.argv[3]])
open(sys.argv[1], "w").write("0")
while True:
    time.sleep(0.05)
"""
