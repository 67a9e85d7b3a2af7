# Rung 4 with real VFs: the real OpenNebula 7.4 front-end of test:opennebula
# driving a VF VM on two libvirt hosts inside the nested SR-IOV host of rung 3
# (simhost/nested_node.py, reached by ssh through L1's user-mode network).
# Its own suite, after driver-vfio: nested TCG makes it the slowest rung
# (~24 min on 2 cores), and test:opennebula stays quick to iterate on.
Support.suite('opennebula-nested', order: 86,
              desc: 'Rung 4 + rung 3: a VF VM through real oned on the nested SR-IOV host',
              packages: OPENNEBULA_PACKAGES, code: [*OPENNEBULA_CODE, 'tests/opennebula/*.py'],
              lane: :beside) do |name|
  next false unless Support.rung4_ready(name)
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '--color=no', '-p', 'no:cacheprovider',
                 'tests/opennebula/test_vf_nested.py', env: { 'KVM_SRIOV_NESTED_RUNG4' => '1' })
end
