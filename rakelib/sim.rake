# Simulated hosts (simhost/): rung 2 (private libvirtd + QEMU TCG hosts) and
# rung 3 (real SR-IOV + VFIO inside a nested QEMU guest).
Support.suite('sim-libvirt', order: 40,
              desc: 'simulated hosts, rung 2: real libvirtd + QEMU (TCG), boot, ACPI shutdown, migration',
              packages: SIM_PACKAGES, code: [*SIM_CODE, 'tests/sim/test_libvirt_host.py']) do |name|
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-m', 'libvirt', 'tests/sim')
end

Support.suite('sim-nested', order: 80,
              desc: 'simulated hosts, rung 3: real SR-IOV VFs + VFIO in a nested QEMU guest',
              packages: SIM_PACKAGES, code: [*SIM_CODE, 'tests/sim/*.py'], lane: :beside) do |name|
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-m', 'vfio', 'tests/sim')
end
