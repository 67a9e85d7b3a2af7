# Rung 4: what a user waits for through a real oned (deploy, live migration,
# suspend, resume), kvm-sriov hosts against stock kvm hosts (bench/oned_actions_bench.py).
Support.suite('bench-oned-actions', order: 93.5,
              desc: 'Rung 4: onevm deploy/migrate --live/suspend/resume on kvm-sriov vs stock kvm hosts (smoke check)',
              packages: OPENNEBULA_PACKAGES,
              code: [*OPENNEBULA_CODE, 'bench/oned_actions_bench.py', 'bench/verdict.py'],
              lane: :main) do |name| # its ratio is side by side and alternating: the other lane's load is on both
  # In `rake test` 2 rounds, a smoke check: every operation must succeed on both setups; the ratios
  # are printed with no verdict (2 per operation cannot tell 10 % from noise): bench:oned-actions judges
  next false unless Support.rung4_ready(name)
  Support.bench(name, Support::SYSTEM_PYTHON, 'bench/oned_actions_bench.py', '--rounds', '2')
end

desc "Rung 4 user-visible times, the timing run: 12 rounds, strict: each operation's median kvm-sriov/stock <= 1.02"
task 'bench:oned-actions' do
  Support.run_suites([Support::Suite.new('bench-oned-actions-full', 0, 'bench-oned-actions, timing run', lambda do |name|
    Support.prepare('bench-oned-actions')
    Support.sh(Support::SYSTEM_PYTHON, '-m', 'simhost.guest_image')
    Support.bench(name, Support::SYSTEM_PYTHON, 'bench/oned_actions_bench.py', '--rounds', '12', '--strict')
  end)])
end
