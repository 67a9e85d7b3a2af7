# Rung 4 with services: OneFlow, OneGate and onehem-server from the same
# OpenNebula 7.4 build as oned (simhost/oneflow.py; build.sh links the gems
# they need) beside the rung-4 front-end of test:opennebula. A two-role
# service runs, scales and goes; OneGate answers a VM with its token. Prints
# the seconds from instantiate to all RUNNING. openssl: the test makes a VM's
# OneGate token as oned does.

Support.suite('oneflow', order: 62,
              desc: 'Rung 4: OneFlow + OneGate services (instantiate, scale, undeploy, VM token)',
              packages: [*OPENNEBULA_PACKAGES, 'openssl'],
              code: [*OPENNEBULA_CODE, 'simhost/oneflow.py', 'tests/opennebula/test_oneflow*.py']) do |name|
  next false unless Support.rung4_ready(name, check: %w[-m simhost.oneflow --check],
                                             missing: 'no OpenNebula 7.4 with OneFlow/OneGate to run (the line above says what to do)')
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '-s', '--color=no', '-p', 'no:cacheprovider',
                 *Dir.glob('tests/opennebula/test_oneflow*.py', base: Support::ROOT).sort,
                 env: { 'KVM_SRIOV_ONEFLOW_RUNG4' => '1' })
end
