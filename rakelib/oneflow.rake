# Rung 4 with services: OneFlow, OneGate and onehem-server from the same
# OpenNebula 7.4 build as oned (simhost/oneflow.py; build.sh links the gems
# they need) beside a rung-4 front-end. A two-role service runs, scales and
# goes; OneGate answers a VM with its token; an IB MPI cluster service
# (templates/oneflow) runs on VFs of four simulated hosts, scales, gets its
# own PKey and leaves nothing behind. Prints the seconds from instantiate to
# all RUNNING. openssl: the test makes a VM's OneGate token as oned does;
# opensm, ibsim-utils, libumad2sim0: the partitions file is judged by opensm.

Support.suite('oneflow', order: 62,
              desc: 'Rung 4: OneFlow + OneGate services (instantiate, scale, undeploy, VM token, IB MPI cluster)',
              packages: [*OPENNEBULA_PACKAGES, 'openssl', 'opensm', 'ibsim-utils', 'libumad2sim0'],
              code: [*OPENNEBULA_CODE, 'simhost/oneflow.py', 'tests/opennebula/test_oneflow*.py',
                     'tests/sched/sched_frontend.py', 'tests/opennebula/test_network_hooks.py']) do |name|
  next false unless Support.rung4_ready(name, check: %w[-m simhost.oneflow --check],
                                             missing: 'no OpenNebula 7.4 with OneFlow/OneGate to run (the line above says what to do)')
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '-s', '--color=no', '-p', 'no:cacheprovider',
                 *Dir.glob('tests/opennebula/test_oneflow*.py', base: Support::ROOT).sort,
                 env: { 'KVM_SRIOV_ONEFLOW_RUNG4' => '1' })
end
