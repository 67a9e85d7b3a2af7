# InfiniBand part: GUID lifecycle, PKey partitions, NUMA, HPC profile,
# monitoring probe, admin CLI (kvm_sriov/{guid,partitions,numa,hpc_profile,probe,
# doctor,cli}.py, im/, bin/kvm-sriov). docs/infiniband.md explains them.
# openssh-client: the fabric tests' SM-node push command is `ssh ...` (a stand-in answers)
IB_PACKAGES = %w[python3-libvirt python3-lxml python3-pytest libvirt-daemon
                 libvirt-clients libxml2-utils iproute2 rake
                 opensm ibsim-utils libumad2sim0 infiniband-diags openssh-client
                 python3-urllib3 openssl].freeze

Support.suite('ib', order: 15,
              desc: 'InfiniBand rung 1: GUIDs (mlx5/mlx4/netlink), partitions.conf checked by the real opensm ' \
                    'on ibsim, NUMA matrix, HPC and GPU-switch XML vs libvirt schema, probe, CLI',
              packages: IB_PACKAGES, code: ['tests/ib/*.py', 'tests/unit/conftest.py', *UnitTests.globs(UnitTests::ELSEWHERE['ib']),
                                             'tests/support/driver_env.py', 'tests/support/fake_sysfs.py',
                                             'tests/support/opensm_sim.py', 'tests/support/probe.py',
                                             'tests/support/stock_standin.py', 'tests/support/actions_in_process.py']) do |name|
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'tests/ib',
                 *UnitTests::ELSEWHERE['ib'])
end

Support.suite('bench-probe', order: 91,
              desc: 'Probe and `kvm-sriov status` wall time on a fake 4 PF x 127 VF host (probe <= 150 ms best of 20, beside its floor: one probe of a 4-5 s system run)',
              packages: %w[python3-libvirt python3-lxml], code: %w[bench/probe_bench.py]) do |name|
  Support.bench(name, Support::SYSTEM_PYTHON, 'bench/probe_bench.py')
end

Support.lint('ib-scripts', order: 15, desc: 'pyflakes on the IB scripts outside the library trees') do |name|
  Support.apt('python3-pyflakes')
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pyflakes', 'bin/kvm-sriov', 'im', 'bench',
                 'contextualization/hostfile/kvm-sriov-hostfile', 'simhost/oneflow.py')
end
