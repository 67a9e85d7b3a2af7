# Shared memory between co-resident VMs (kvm_sriov/ivshmem*.py, docs/ivshmem.md):
# rung 1 (request, names, region table, reconcile plan) and rung 2 (the
# installed actions on a real libvirtd + QEMU, two guests sharing a region, and
# the inter-VM ping-pong: region vs network, kvm_sriov_bench/shm_pingpong.py).
# HOST_PACKAGES / DRIVER_SIM_PACKAGES come from driver.rake (loaded before this file).
Support.suite('ivshmem', order: 46,
              desc: 'IVShmem: a VM group shares a /dev/shm region on one host (rung 1 + rung 2)') do |name|
  Support.apt(HOST_PACKAGES, DRIVER_SIM_PACKAGES, 'shellcheck', 'gcc', 'libc6-dev')
  # -rP: the ping-pong test's side-by-side figures are printed in the log
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '-rP', '--color=no', '-p', 'no:cacheprovider',
                 'tests/ivshmem')
end
