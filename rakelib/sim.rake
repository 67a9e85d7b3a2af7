# Simulated hosts (simhost/): rung 2 (private libvirtd + QEMU TCG hosts) and
# rung 3 (real SR-IOV + VFIO inside a nested QEMU guest).
Support.suite('sim-libvirt', order: 40,
              desc: 'simulated hosts, rung 2: real libvirtd + QEMU (TCG), boot, ACPI shutdown, migration',
              packages: SIM_PACKAGES, code: [*SIM_CODE, 'tests/sim/test_libvirt_host.py']) do |name|
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-m', 'libvirt', 'tests/sim')
end

# Only the nested host's command line: its VFs and VFIO are checked inside driver-vfio's
# nested host (tests/sim/l1_vfio_checks.py), whose boot they share.
Support.suite('sim-nested', order: 80,
              desc: 'simulated hosts, rung 3: the nested QEMU host\'s command passes output and exit status through',
              packages: SIM_PACKAGES, code: [*SIM_CODE, 'tests/sim/*.py'], lane: :beside) do |name|
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-m', 'vfio', 'tests/sim')
end
