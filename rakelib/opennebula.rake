# Rung 4: a real OpenNebula 7.4 front-end (oned, monitord, the rank scheduler,
# the CLI, pyone) driving simulated KVM hosts over ssh (simhost/frontend.py).
# OpenNebula comes from $KVM_SRIOV_OPENNEBULA or ../shared/opennebula/build.sh
# (built once, ~8 min on 2 cores, then cached outside the clone). ovmf: the
# UEFI firmware and variables a UEFI VM of the stock-feature tests uses
# (OPENNEBULA_PACKAGES: rakelib/prereqs.rb).

Support.suite('opennebula', order: 60,
              desc: 'Rung 4: a real OpenNebula 7.4 front-end (oned, scheduler, CLI, pyone) over simulated hosts',
              # opensm, ibsim-utils, libumad2sim0: the SM of test_network_hooks.py judges its file;
              # prometheus, its node exporter and the client: the same test's front-end metrics scraped
              packages: OPENNEBULA_PACKAGES + %w[opensm ibsim-utils libumad2sim0 prometheus
                                                 prometheus-node-exporter python3-prometheus-client],
              code: [*OPENNEBULA_CODE, 'tests/opennebula/*.py', 'tests/support/prometheus.py']) do |name|
  py = Support.venv_python(pip: ['pyone'])
  next false unless Support.rung4_ready(name, python: py)
  Support.logged(name, py, '-m', 'pytest', '-q', '--color=no', '-p', 'no:cacheprovider', '--durations=8', 'tests/opennebula')
end
