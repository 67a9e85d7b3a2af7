# The efficiency harness (kvm_sriov_bench/): its test suite and its
# 1,000,000-sample analysis benchmark. Everything it needs is installed here:
# Debian's hpcc, OpenMPI, numpy/scipy/matplotlib/mpi4py, and pyone (PyPI)
# in the project venv.
HARNESS_APT = %w[hpcc openmpi-bin python3-numpy python3-scipy python3-matplotlib
                 python3-mpi4py python3-pytest python3-lxml python3-requests].freeze
HARNESS_ENV = {
  'OMPI_ALLOW_RUN_AS_ROOT' => '1', 'OMPI_ALLOW_RUN_AS_ROOT_CONFIRM' => '1',
  'OMPI_MCA_btl_tcp_if_include' => 'lo', 'OMPI_MCA_oob_tcp_if_include' => 'lo',
  'MPLBACKEND' => 'Agg', 'PYTHONDONTWRITEBYTECODE' => '1'
}.freeze

Support.suite('harness', order: 25,
              desc: 'Harness: parsers on real outputs, real hpcc + MPI ping-pong, statistics, report, pyone vs stand-in oned',
              packages: HARNESS_APT, code: ['tests/harness/*.py']) do |name|
  py = Support.venv_python(pip: ['pyone'])
  Support.logged(name, py, '-m', 'pytest', '-p', 'no:cacheprovider', 'tests/harness', env: HARNESS_ENV)
end

Support.suite('bench-harness', order: 90,
              desc: 'Harness benchmark: `kvm-sriov-bench analyze` on a long campaign (20,000-row samples.csv), whole command <= 1 s, <= 300 MB, side by side with reading the file raw',
              packages: %w[python3-numpy python3-scipy], code: %w[bench/harness_analysis.py]) do |name|
  Support.bench(name, Support::SYSTEM_PYTHON, 'bench/harness_analysis.py', '--budget', '1.0', '--memory', '300',
                 env: HARNESS_ENV)
end
