# Rung 4 at scale: 1,000 IB networks and 20,000 held leases in a real oned, two SM nodes as
# local folders: a network change until both SM nodes reloaded (target <= 10 s) and
# `kvm-sriov partitions --check` (target < 10 s), beside the same steps at rung 1 without
# oned (bench/partitions_scale_bench.py). opensm, ibsim-utils, libumad2sim0: each SM node's
# real opensm validates the file before it is installed.
Support.suite('bench-partitions-scale', order: 95,
              desc: 'Rung 4: 1,000 IB networks / 20,000 leases in oned: a change reaching 2 SM nodes <= 10 s, ' \
                    'partitions --check < 10 s (and the same steps at rung 1)',
              not_in_test: 'minutes of populating oned with 1,000 networks and 20,000 leases for two figures; ' \
                           'run it as ./dev test:bench-partitions-scale',
              packages: OPENNEBULA_PACKAGES + %w[opensm ibsim-utils libumad2sim0],
              code: [*OPENNEBULA_CODE, 'bench/partitions_scale_bench.py', 'bench/verdict.py']) do |name|
  next false unless Support.rung4_ready(name)
  Support.bench(name, Support::SYSTEM_PYTHON, 'bench/partitions_scale_bench.py')
end
