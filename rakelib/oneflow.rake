# Rung 4 with services: OneFlow, OneGate and onehem-server from the same
# OpenNebula 7.4 build as oned (simhost/oneflow.py; build.sh links the gems
# they need) beside a rung-4 front-end. A two-role service runs, scales and
# goes; OneGate answers a VM with its token; two tenants' IB MPI clusters
# (templates/oneflow: spread for oneadmin, pack for a user of another group)
# run on VFs of four simulated hosts, each with its own PKey, scale, follow a
# PKey changed under them and leave nothing behind. Prints the seconds from
# instantiate to all RUNNING. openssl: the test makes a VM's OneGate token as
# oned does; opensm, ibsim-utils, libumad2sim0: the partitions file is judged
# by opensm. pyone (PyPI, in the venv): kvm-sriov-bench's service target.

Support.suite('oneflow', order: 62,
              desc: 'Rung 4: OneFlow + OneGate services (instantiate, scale, undeploy, VM token, two tenants\' IB MPI clusters)',
              packages: [*OPENNEBULA_PACKAGES, 'openssl', 'opensm', 'ibsim-utils', 'libumad2sim0'],
              code: [*OPENNEBULA_CODE, 'simhost/oneflow.py', 'tests/opennebula/test_oneflow*.py',
                     'tests/sched/sched_frontend.py', 'tests/opennebula/test_network_hooks.py',
                     'tests/ivshmem/oned/test_ivshmem_oned.py', 'kvm_sriov_bench/oneflow.py',
                     'kvm_sriov_bench/opennebula.py']) do |name|
  py = Support.venv_python(pip: ['pyone'])   # the harness's service target reads oned through pyone
  next false unless Support.rung4_ready(name, python: py, check: %w[-m simhost.oneflow --check],
                                             missing: 'no OpenNebula 7.4 with OneFlow/OneGate to run (the line above says what to do)')
  Support.logged(name, py, '-m', 'pytest', '-q', '-s', '--color=no', '-p', 'no:cacheprovider',
                 *Dir.glob('tests/opennebula/test_oneflow*.py', base: Support::ROOT).sort,
                 env: { 'KVM_SRIOV_ONEFLOW_RUNG4' => '1' })
end
