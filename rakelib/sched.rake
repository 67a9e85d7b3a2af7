# Scheduling (kvm_sriov/{availability,placement,placement_program,monitor}.py,
# sched/kvm-sriov/place): one definition of free VFs, fresh counts after every
# pool change, and VF accounting in OpenNebula's scheduler (docs/scheduling.md).

Support.suite('sched', order: 16,
              desc: 'Scheduling: probe/deploy/status/placement agree on free VFs, monitoring refresh, ' \
                    'the placement policy on scheduler documents from OpenNebula 7.4',
              packages: %w[python3-libvirt python3-pytest],
              code: ['tests/sched/test_*.py', *UnitTests.globs(UnitTests::ELSEWHERE['sched']), 'tests/support/probe.py',
                     'tests/support/placement.py', 'tests/support/stock_standin.py',
                     'tests/support/actions_in_process.py']) do |name|
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'tests/sched',
                 *UnitTests::ELSEWHERE['sched'])
end

Support.suite('bench-sched-place', order: 92,
              desc: 'Placement policy cost for pending VMs on 100 hosts next to rank alone (<= 1.2x; 300 VMs here, 1,000 in bench:sched-place)',
              packages: %w[python3-libvirt python3-lxml], code: %w[bench/sched_place_bench.py]) do |name|
  # In `rake test` 300 pending VMs (rank alone ~10 s a round here); `rake bench:sched-place`
  # is the timing run on 1,000
  Support.bench(name, Support::SYSTEM_PYTHON, 'bench/sched_place_bench.py', '--vms', '300')
end

desc 'Placement cost, the timing run: 1,000 pending VMs on 100 hosts, 3 rounds'
task 'bench:sched-place' do
  Support.run_suites([Support::Suite.new('bench-sched-place-full', 0, 'bench-sched-place, 1,000 VMs', lambda do |name|
    Support.prepare('bench-sched-place')
    Support.bench(name, Support::SYSTEM_PYTHON, 'bench/sched_place_bench.py')
  end)])
end

Support.suite('bench-sched-refresh', order: 93,
              desc: 'Rung 4: time from a pool change to the new KVM_SRIOV_FREE_VFS in oned (<= 5 s)',
              packages: OPENNEBULA_PACKAGES,
              code: [*OPENNEBULA_CODE, 'bench/sched_refresh_bench.py', 'tests/sched/sched_frontend.py']) do |name|
  py = Support.venv_python(pip: ['pyone'])
  Support.bench(name, py, 'bench/sched_refresh_bench.py')
end

# `rake install` also puts the placement policy next to OpenNebula's own
# (<remotes>/scheduler/kvm-sriov/place); SCHED_MAD's `-p kvm-sriov` selects it.
task :install do
  remotes = KvmSriovInstall.remotes
  ids = KvmSriovInstall.owner(remotes)
  dst = File.join(remotes, 'scheduler', 'kvm-sriov')
  KvmSriovInstall.install_file(File.join(Support::ROOT, 'sched', 'kvm-sriov', 'place'), dst, ids, mode: 0o755)
  puts "installed the kvm-sriov placement policy into #{dst} (SCHED_MAD ARGUMENTS \"-t 15 -p kvm-sriov -o one_drs\")"
end
