# Simulated hosts (simhost/): rung 2 (private libvirtd + QEMU TCG hosts) and
# rung 3 (real SR-IOV + VFIO inside a nested QEMU guest).
SIM_PACKAGES = %w[
  qemu-system-x86 libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients
  python3-libvirt python3-pytest busybox-static cpio kmod iproute2
].freeze

Support.suite('sim-libvirt', order: 40,
              desc: 'simulated hosts, rung 2: real libvirtd + QEMU (TCG), boot, ACPI shutdown, migration') do |name|
  Support.apt(SIM_PACKAGES)
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-m', 'libvirt', 'tests/sim')
end

Support.suite('sim-nested', order: 80,
              desc: 'simulated hosts, rung 3: real SR-IOV VFs + VFIO in a nested QEMU guest') do |name|
  Support.apt(SIM_PACKAGES)
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-m', 'vfio', 'tests/sim')
end
