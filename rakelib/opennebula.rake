# Rung 4: a real OpenNebula 7.4 front-end (oned, monitord, the rank scheduler,
# the CLI, pyone) driving simulated KVM hosts over ssh (simhost/frontend.py).
# OpenNebula comes from $KVM_SRIOV_OPENNEBULA or ../shared/opennebula/build.sh
# (built once, ~8 min on 2 cores, then cached outside the clone). ovmf: the
# UEFI firmware and variables a UEFI VM of the stock-feature tests uses
# (OPENNEBULA_PACKAGES: rakelib/prereqs.rb).

Support.suite('opennebula', order: 60,
              desc: 'Rung 4: a real OpenNebula 7.4 front-end (oned, scheduler, CLI, pyone) over simulated hosts',
              packages: OPENNEBULA_PACKAGES, code: [*OPENNEBULA_CODE, 'tests/opennebula/*.py'],
              lane: :beside) do |name| # beside the others in `rake test`: it balances the two lanes
  py = Support.venv_python(pip: ['pyone'])
  # one line and a failed suite when there is no OpenNebula to run (never a silent pass)
  unless Support.logged(name, py, '-m', 'simhost.frontend', '--locate')
    Support.setup_failed(name, 'no OpenNebula 7.4 to run (the line above says what to set)')
    next false
  end
  Support.sh(Support::SYSTEM_PYTHON, '-m', 'simhost.guest_image')
  Support.logged(name, py, '-m', 'pytest', '-q', '--color=no', '-p', 'no:cacheprovider', 'tests/opennebula')
end
