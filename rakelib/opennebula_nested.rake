# Rung 4 with real VFs: the real OpenNebula 7.4 front-end of test:opennebula
# driving a VF VM on two libvirt hosts inside the nested SR-IOV host of rung 3
# (simhost/nested_node.py, reached by ssh through L1's user-mode network). The
# VM is a one-role OneFlow service (simhost/oneflow.py, no OneGate), as a
# tenant's cluster member is. Its own suite, after driver-vfio: nested TCG
# makes it one of the slowest (~11 min alone on 2 cores, ~17 beside the first
# lane), and test:opennebula stays quick to iterate on. Prints each step's seconds.
Support.suite('opennebula-nested', order: 86,
              desc: 'Rung 4 + rung 3: a OneFlow service\'s VF VM through real oned on the nested SR-IOV host',
              packages: OPENNEBULA_PACKAGES,
              code: [*OPENNEBULA_CODE, 'simhost/oneflow.py', 'tests/opennebula/*.py'],
              lane: :beside) do |name|
  next false unless Support.rung4_ready(name, check: %w[-m simhost.oneflow --check],
                                              missing: 'no OpenNebula 7.4 with OneFlow to run (the line above says what to do)')
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '-s', '--color=no', '-p', 'no:cacheprovider',
                 'tests/opennebula/test_vf_nested.py', env: { 'KVM_SRIOV_NESTED_RUNG4' => '1' })
end
