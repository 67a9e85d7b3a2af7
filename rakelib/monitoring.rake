# The VM traffic probe (im/kvm-probes.d/vm/monitor/kvm_sriov_vf.py, docs/monitoring.md):
# its rung-1 tests run in test:driver-unit (tests/unit/kvm_sriov/node/test_traffic*.py),
# its rung-4 test with test:opennebula (tests/opennebula/test_vf_traffic.py).

Support.suite('bench-vm-traffic', order: 91.5,
              desc: 'VM traffic probe wall time beside the host probe on a fake 4 PF x 127 VF host ' \
                    '(<= 150 ms best of 10: it runs in every VM monitoring run)',
              # python3-libvirt: probe_bench.py's installed_remotes, imported from there
              packages: %w[python3-libvirt], code: %w[bench/vm_traffic_bench.py bench/probe_bench.py]) do |name|
  Support.bench(name, Support::SYSTEM_PYTHON, 'bench/vm_traffic_bench.py')
end
