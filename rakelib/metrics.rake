# Prometheus metrics (kvm_sriov/metrics/, `kvm-sriov metrics`), the Grafana dashboard and
# the alert rules (monitoring/): docs/metrics.md. Rung 1: a fake sysfs host and the
# libvirt test driver, then the real node exporter and Prometheus on loopback.
METRICS_PACKAGES = %w[prometheus prometheus-node-exporter python3-prometheus-client python3-pytest
                      python3-yaml python3-libvirt].freeze

Support.suite('metrics', order: 17,
              desc: 'Metrics rung 1: the figures on the fake host, the dashboard and the alert rules ' \
                    'evaluated by the real Prometheus and node exporter on loopback',
              packages: METRICS_PACKAGES,
              code: ['tests/metrics/*.py', *UnitTests.globs(UnitTests::ELSEWHERE['metrics']),
                     'tests/support/fake_sysfs.py', 'tests/support/prometheus.py']) do |name|
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'tests/metrics',
                 *UnitTests::ELSEWHERE['metrics'])
end
