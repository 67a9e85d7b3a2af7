# The host driver (kvm_sriov/, vmm/kvm-sriov/): its suites and lint (install: install.rake, demo: demo.rake).

Support.suite('driver-unit', order: 10,
              desc: 'Driver rung 1: fake sysfs, pool, XML, protocol, actions on libvirt test driver',
              # iproute2: the counters' ip; busybox-static: qualify's guest report run by a small image's sh
              packages: [*HOST_PACKAGES, 'libvirt-daemon', 'procps', 'rake', 'iproute2', 'busybox-static'],
              code: ['tests/driver/test_*.py', '!tests/driver/*_libvirtd.py',
                     'tests/unit/**/*.py', *UnitTests.globs(UnitTests::ELSEWHERE.values.flatten).map { |g| "!#{g}" },
                     'tests/support/driver_env.py', 'tests/support/fake_sysfs.py', 'tests/support/stock_standin.py',
                     'tests/support/actions_in_process.py', 'tests/support/install.py']) do |name|
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '--color=no', '-p', 'no:cacheprovider',
                 'tests/driver', 'tests/unit', *UnitTests::ELSEWHERE.values.flatten.map { |t| "--ignore=#{t}" },
                 '-m', 'not libvirt and not vfio')
end

Support.lint('python', order: 10, desc: 'pyflakes on the Python trees') do |name|
  Support.apt('python3-pyflakes')
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pyflakes', 'kvm_sriov', 'kvm_sriov_bootstrap.py', 'vmm', 'tests')
end

# Rung 2 needs the simulated hosts of simhost/ (a private libvirtd + QEMU TCG) and the
# stock kvm scripts the driver runs: DRIVER_SIM_PACKAGES and DRIVER_SIM_CODE (prereqs.rb).

Support.suite('driver-libvirt', order: 45,
              desc: 'Driver rung 2: installed action scripts on a real libvirtd + QEMU',
              packages: DRIVER_SIM_PACKAGES, code: [*DRIVER_SIM_CODE, 'tests/driver/*.py']) do |name|
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '--color=no', '-p', 'no:cacheprovider',
                 'tests/driver', '-m', 'libvirt')
end

# Rung 3: real SR-IOV VFs and VFIO in a nested host (simhost.nested). The
# guest image is built out here, where apt can download the kernel; returns
# the command that runs cmd inside the nested host, from the checkout.
module NestedHost
  module_function

  def command(*cmd, timeout: nil)
    Support.sh(Support::SYSTEM_PYTHON, '-m', 'simhost.guest_image')
    [Support::SYSTEM_PYTHON, '-m', 'simhost.nested', '--vfs', '4', '--cwd', Support::ROOT,
     *(timeout ? ['--timeout', timeout.to_s] : []), '--', *cmd]
  end
end

# The nested host's guard (simhost.nested, 1800 s by default) is a hang guard, not a
# budget: this suite took 888-1117 s beside the first lane on an earlier machine, 1560 s
# alone on a slower one; beside the first lane and one CPU hog it took 2480 s (17 tests,
# before the GPU module joined it: ~175 s quiet, 7-15 min at load 10-20).
VFIO_GUARD = 4200

# One nested host (its boot shared) for every rung-3 module: the host's own VFs and VFIO
# (simhost's checks, first: every VF still unbound), the driver's VFs, killed actions, live
# migration, and the GPU pairing on the host's two PCIe switches (last: its fixture turns the
# switches' VFs on and off again).
Support.suite('driver-vfio', order: 85,
              desc: 'Driver rung 3: real VFs + vfio-pci in a nested SR-IOV host, GPU pairing on its PCIe switches',
              packages: DRIVER_SIM_PACKAGES,
              code: [*DRIVER_SIM_CODE, 'tests/driver/*.py', 'tests/sim/l1_vfio_checks.py', 'tests/sim/conftest.py'],
              lane: :beside) do |name|
  Support.logged(name, *NestedHost.command(Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '--color=no',
                                           '-p', 'no:cacheprovider', '--durations=6', 'tests/sim/l1_vfio_checks.py',
                                           'tests/driver/l1_driver_vfio.py',
                                           'tests/driver/l1_driver_faults.py', 'tests/driver/l1_driver_migrate.py',
                                           'tests/driver/l1_driver_gpu.py', timeout: VFIO_GUARD))
end

# Benchmarks of the driver itself (ratios measured side by side in one run).
Support.suite('bench-pool', order: 92,
              desc: 'VF pool: 1,000 allocate/release cycles from 16 processes on 4 PFs x 127 VFs',
              packages: [*HOST_PACKAGES, 'libvirt-daemon'], code: %w[bench/pool_bench.py bench/verdict.py]) do |name|
  # in `rake test` its target is reported, not judged: beside the other lane (and on a user's
  # busy machine) 16 processes on 2 cores set the tail, not the pool; a VF given twice fails it
  Support.bench(name, Support::SYSTEM_PYTHON, 'bench/pool_bench.py')
end

desc 'VF pool under contention, the timing run: p99 allocate judged (3 attempts), strict'
task 'bench:pool' do
  Support.run_suites([Support::Suite.new('bench-pool-full', 0, 'bench-pool, timing run', lambda do |name|
    Support.prepare('bench-pool')
    Support.bench(name, Support::SYSTEM_PYTHON, 'bench/pool_bench.py', '--strict')
  end)])
end

Support.suite('bench-actions', order: 93,
              desc: 'Driver overhead: each action vs the stock kvm script on a VM without VFs (rung 2)',
              packages: DRIVER_SIM_PACKAGES, code: [*DRIVER_SIM_CODE, 'bench/actions_bench.py'],
              # driver-libvirt runs the same actions on the same rung; 2 rounds beside the nested
              # lane could not tell 5 % from noise, and cost the first lane ~100 s of TCG
              not_in_test: 'a timing run (rung 2, ~2 min for 2 rounds); ./dev bench:actions judges 12') do |name|
  # a short run: every action through both drivers, ratios printed, no verdict;
  # `rake bench:actions` is the timing run with its gate
  Support.bench(name, Support::SYSTEM_PYTHON, 'bench/actions_bench.py', '--rounds', '2', '--calls', '3')
end

desc 'Driver overhead, the timing run: 12 rounds (up to 20 while a median is over 1.05), strict'
task 'bench:actions' do
  # 12 rounds (~45 s each; 6 crossovers, the fewest with an interval), up to 20 while a median is
  # over 1.05 (no round begun after 15 minutes); fails only if an action's whole 95 % interval is over it
  Support.run_suites([Support::Suite.new('bench-actions-full', 0, 'bench-actions, timing run', lambda do |name|
    Support.prepare('bench-actions')
    Support.bench(name, Support::SYSTEM_PYTHON, 'bench/actions_bench.py', '--rounds', '12', '--max-rounds', '20',
                  '--strict')
  end)])
end

# Rung 3 again (its own nested host): what a VF adds to unplug/plug, save, restore.
Support.suite('bench-hotplug', order: 94,
              desc: 'VF cost on rung 3: confirmed unplug/plug and save/restore with a VF vs without',
              packages: DRIVER_SIM_PACKAGES, code: [*DRIVER_SIM_CODE, 'bench/hotplug_bench.py'], lane: :beside,
              # driver-vfio proves the same actions work with a VF; this nested host's 9 minutes
              # were the end of `rake test`'s critical path
              not_in_test: 'a timing run (9 min of nested TCG); ./dev bench:hotplug or ./dev test:bench-hotplug') do |name|
  # one round as a suite (what a VF adds, checked to work); `rake bench:hotplug` takes three
  Support.bench(name, *NestedHost.command(Support::SYSTEM_PYTHON, 'bench/hotplug_bench.py', '--rounds', '1'))
end

desc 'VF cost on rung 3, the timing run (3 rounds)'
task 'bench:hotplug' do
  Support.run_suites([Support::Suite.new('bench-hotplug-full', 0, 'bench-hotplug, 3 rounds', lambda do |name|
    Support.prepare('bench-hotplug')
    Support.bench(name, *NestedHost.command(Support::SYSTEM_PYTHON, 'bench/hotplug_bench.py', '--rounds', '3'))
  end)])
end
