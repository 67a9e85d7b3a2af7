# The host driver (kvm_sriov/, vmm/kvm-sriov/): its suites, lint, demo (install: install.rake).
HOST_PACKAGES = %w[python3-libvirt python3-lxml python3-jinja2 python3-pytest].freeze

Support.suite('driver-unit', order: 10,
              desc: 'Driver rung 1: fake sysfs, pool, XML, protocol, actions on libvirt test driver') do |name|
  Support.apt(HOST_PACKAGES, 'libvirt-daemon')
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '--color=no', '-p', 'no:cacheprovider',
                 'tests/driver', '-m', 'not libvirt and not vfio')
end

Support.lint('python', order: 10, desc: 'pyflakes on the Python trees') do |name|
  Support.apt('python3-pyflakes')
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pyflakes', 'kvm_sriov', 'vmm', 'tests')
end

# Rung 2 needs the simulated hosts of simhost/ (a private libvirtd + QEMU TCG).
DRIVER_SIM_PACKAGES = %w[qemu-system-x86 libvirt-daemon-system libvirt-clients libvirt-daemon-driver-qemu
                  busybox-static cpio kmod iproute2 rake].freeze

Support.suite('driver-libvirt', order: 45,
              desc: 'Driver rung 2: installed action scripts on a real libvirtd + QEMU') do |name|
  Support.apt(HOST_PACKAGES, DRIVER_SIM_PACKAGES)
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '--color=no', '-p', 'no:cacheprovider',
                 'tests/driver', '-m', 'libvirt')
end

# Rung 3: real SR-IOV VFs and VFIO in a nested host (simhost.nested). The
# guest image is built out here, where apt can download the kernel; returns
# the command that runs cmd inside the nested host, from the checkout.
module NestedHost
  module_function

  def command(*cmd, timeout: nil)
    Support.apt(HOST_PACKAGES, DRIVER_SIM_PACKAGES, 'qemu-utils')
    Support.sh(Support::SYSTEM_PYTHON, '-c', 'from simhost.guest_image import ensure_guest_image; ensure_guest_image()')
    [Support::SYSTEM_PYTHON, '-m', 'simhost.nested', '--vfs', '4', '--cwd', Support::ROOT,
     *(timeout ? ['--timeout', timeout.to_s] : []), '--', *cmd]
  end
end

Support.suite('driver-vfio', order: 85,
              desc: 'Driver rung 3: real VFs + vfio-pci in a nested SR-IOV host') do |name|
  Support.logged(name, *NestedHost.command(Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '--color=no',
                                           '-p', 'no:cacheprovider', 'tests/driver/l1_driver_vfio.py',
                                           'tests/driver/l1_driver_faults.py', 'tests/driver/l1_driver_migrate.py'))
end

desc 'Demo: the driver on a built-in simulated SR-IOV host (nested QEMU, no IB hardware needed)'
task :demo do
  # ~15-22 min in L1 (1290 s at load 10): more room than L1's default 1800 s
  Support.sh(*NestedHost.command(Support::SYSTEM_PYTHON, '-m', 'simhost.demo', timeout: 3600))
end

# Benchmarks of the driver itself (ratios measured side by side in one run).
Support.suite('bench-pool', order: 92,
              desc: 'VF pool: 1,000 allocate/release cycles from 16 processes on 4 PFs x 127 VFs') do |name|
  Support.apt(HOST_PACKAGES, 'libvirt-daemon')
  Support.bench(name, Support::SYSTEM_PYTHON, 'bench/pool_bench.py', '--strict')  # p99 allocate > 20 ms fails (after 3 attempts)
end

Support.suite('bench-actions', order: 93,
              desc: 'Driver overhead: each action vs the stock kvm script on a VM without VFs (rung 2)') do |name|
  Support.apt(HOST_PACKAGES, DRIVER_SIM_PACKAGES)
  # 12 rounds (~45 s each; 6 crossovers, the fewest with an interval), up to 20 while a median is
  # over 1.05 (no round begun after 15 minutes); fails only if an action's whole 95 % interval is over it
  Support.bench(name, Support::SYSTEM_PYTHON, 'bench/actions_bench.py', '--rounds', '12', '--max-rounds', '20',
                '--strict')
end

# Rung 3 again (its own nested host): what a VF adds to unplug/plug, save, restore.
Support.suite('bench-hotplug', order: 94,
              desc: 'VF cost on rung 3: confirmed unplug/plug and save/restore with a VF vs without') do |name|
  Support.bench(name, *NestedHost.command(Support::SYSTEM_PYTHON, 'bench/hotplug_bench.py', '--rounds', '3'))
end
