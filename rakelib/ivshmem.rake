# Shared memory between co-resident VMs (kvm_sriov/ivshmem*.py, docs/ivshmem.md):
# rung 1 (request, names, region table, reconcile plan) and rung 2 (the
# installed actions on a real libvirtd + QEMU, two guests sharing a region, and
# the inter-VM ping-pong: region vs network, kvm_sriov_bench/shm_pingpong.py).
# DRIVER_SIM_PACKAGES and DRIVER_SIM_CODE come from prereqs.rb.
Support.suite('ivshmem', order: 46,
              desc: 'IVShmem: a VM group shares a /dev/shm region on one host (rung 1 + rung 2)',
              packages: [*DRIVER_SIM_PACKAGES, 'shellcheck', 'gcc', 'libc6-dev'],
              code: [*DRIVER_SIM_CODE, 'tests/ivshmem/*.py']) do |name|
  # -rP: the ping-pong test's side-by-side figures are printed in the log
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '-rP', '--color=no', '-p', 'no:cacheprovider',
                 'tests/ivshmem', '--ignore=tests/ivshmem/oned')
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
