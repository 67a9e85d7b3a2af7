# Shared memory between co-resident VMs (kvm_sriov/ivshmem*.py, docs/ivshmem.md):
# rung 1 (request, names, region table, reconcile plan) and rung 2 (the
# installed actions on a real libvirtd + QEMU, two guests sharing a region, and
# the inter-VM ping-pong through the region and over the network,
# kvm_sriov_bench/shm_pingpong.py; which is faster is bench-ivshmem-pingpong's).
# DRIVER_SIM_PACKAGES and DRIVER_SIM_CODE come from prereqs.rb.
Support.suite('ivshmem', order: 46,
              desc: 'IVShmem: a VM group shares a /dev/shm region on one host (rung 1 + rung 2)',
              packages: [*DRIVER_SIM_PACKAGES, 'shellcheck', 'gcc', 'libc6-dev'],
              code: [*DRIVER_SIM_CODE, 'tests/ivshmem/*.py', *UnitTests.globs(UnitTests::ELSEWHERE['ivshmem'])]) do |name|
  # -rP: the ping-pong test's figures are printed in the log (no verdict on them)
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '-rP', '--color=no', '-p', 'no:cacheprovider',
                 'tests/ivshmem', '--ignore=tests/ivshmem/oned', *UnitTests::ELSEWHERE['ivshmem'])
end

# The ping-pong's speed: region vs network, the ratio printed (bench/ivshmem_pingpong_bench.py).
# Busy-polling vCPUs under TCG need a host core each, so `rake test` runs one round on the
# quiet machine with no verdict; `rake bench:ivshmem-pingpong` is the timing run with its gate.
Support.suite('bench-ivshmem-pingpong', order: 94.5,
              desc: 'IVShmem ping-pong: 8 B round trip through the region vs over the network, two VMs (rung 2)',
              packages: [*DRIVER_SIM_PACKAGES, 'gcc', 'libc6-dev'],
              code: [*DRIVER_SIM_CODE, 'tests/ivshmem/guest.py', 'tests/ivshmem/test_ivshmem_libvirtd.py',
                     'tests/ivshmem/test_ivshmem_pingpong.py', 'kvm_sriov_bench/shm_pingpong.py',
                     'bench/ivshmem_pingpong_bench.py', 'bench/verdict.py']) do |name|
  Support.bench(name, Support::SYSTEM_PYTHON, 'bench/ivshmem_pingpong_bench.py', '--rounds', '1')
end

desc 'IVShmem ping-pong, the timing run: 3 rounds, strict (the region must be the faster path)'
task 'bench:ivshmem-pingpong' do
  Support.run_suites([Support::Suite.new('bench-ivshmem-pingpong-full', 0, 'bench-ivshmem-pingpong, 3 rounds', lambda do |name|
    Support.prepare('bench-ivshmem-pingpong')
    Support.bench(name, Support::SYSTEM_PYTHON, 'bench/ivshmem_pingpong_bench.py', '--rounds', '3', '--strict')
  end)])
end

# Rung 4: a VM group of two VMs with the attribute through a real oned (a
# front-end of its own, build/rung4-ivshmem). Without OpenNebula the test
# fails with one line (simhost.frontend.OpenNebulaMissing), never passes.
Support.suite('ivshmem-oned', order: 61,
              desc: 'IVShmem rung 4: a VM group shares a region, suspend/resume, terminate, on real oned',
              packages: OPENNEBULA_PACKAGES, code: [*OPENNEBULA_CODE, 'tests/ivshmem/oned/*.py']) do |name|
  Support.sh(Support::SYSTEM_PYTHON, '-m', 'simhost.guest_image')
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '--color=no', '-p', 'no:cacheprovider',
                 'tests/ivshmem/oned')
end
