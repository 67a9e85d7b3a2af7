# The Debian package sets the suites and the demo declare (Support.suite packages:),
# loaded before any rakelib/*.rake so that every file can use them. Each set names
# what its code starts: `./dev lint:packages` checks every program the code runs
# (dev-tools/programs.py) comes from a declared package or the base system.

# the host library and its tests (python3-lxml: the tests' XML checks; the library uses none)
HOST_PACKAGES = %w[python3-libvirt python3-lxml python3-pytest].freeze

# simulated hosts (simhost/): a private libvirtd + QEMU (TCG) per host, the busybox guest
# image (kernel from apt, modules by kmod, cpio), netns (iproute2); a networked
# host runs an sshd with its own keys (openssh-server, openssh-client); rake: the
# driver is installed into the hosts' remotes with `rake install`
SIM_PACKAGES = %w[
  python3-libvirt python3-lxml python3-pytest
  qemu-system-x86 libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients
  busybox-static cpio kmod iproute2 openssh-server openssh-client rake
].freeze
SIM_CODE = %w[simhost/libvirt_host.py simhost/reaper.py simhost/guest_image.py simhost/nested.py].freeze

# what OpenNebula's stock kvm scripts (run by the driver) call on a host: ruby,
# virsh, xmllint, jq, sudo; qemu-utils: qemu-img
STOCK_KVM_PACKAGES = %w[ruby libvirt-clients libxml2-utils jq sudo qemu-utils].freeze

# Rung 4: a real OpenNebula front-end over simulated hosts (ssh, rsync, lspci,
# xorriso for the context CD, nc, ovmf for the UEFI VM)
OPENNEBULA_PACKAGES = (HOST_PACKAGES + SIM_PACKAGES + STOCK_KVM_PACKAGES + %w[
  netcat-openbsd rsync pciutils xorriso procps ovmf
]).uniq.freeze
# the helpers under tests/support/ that the rung-2 and rung-4 tests share
SUPPORT_CODE = %w[tests/support/driver_env.py tests/support/runnable.py tests/support/fake_sysfs.py].freeze
OPENNEBULA_CODE = [*SIM_CODE, 'simhost/frontend.py', 'simhost/nested_node.py', *SUPPORT_CODE].freeze

# The driver on simulated hosts (rung 2 and 3) and the demo, which runs it there: the
# simulated hosts and the stock kvm scripts the driver runs
DRIVER_SIM_PACKAGES = (HOST_PACKAGES + SIM_PACKAGES + STOCK_KVM_PACKAGES + %w[procps]).uniq.freeze
DRIVER_SIM_CODE = [*SIM_CODE, 'simhost/stock_kvm.py', 'simhost/opennebula_call.py', *SUPPORT_CODE].freeze

# Rung-1 tests of the library live in tests/unit/<package path>/test_<module>.py
# (docs/conventions.md). driver-unit runs every file under tests/unit except these
# (a folder or a file), which the suite named runs with the packages it declares.
module UnitTests
  ELSEWHERE = {
    'metrics' => %w[tests/unit/kvm_sriov/metrics],   # python3-prometheus-client: rakelib/metrics.rake
    'ib' => %w[tests/unit/kvm_sriov/ib tests/unit/kvm_sriov/frontend/test_network_hook.py
               tests/unit/kvm_sriov/domain/test_hpc_profile.py tests/unit/kvm_sriov/domain/test_pcie_switch.py
               tests/unit/kvm_sriov/node/test_probe.py
               tests/unit/kvm_sriov/oned/test_vm_template.py tests/unit/kvm_sriov/vf/test_numa.py
               tests/unit/kvm_sriov/fabric],
    'sched' => %w[tests/unit/kvm_sriov/scheduler],
    'ivshmem' => %w[tests/unit/kvm_sriov/ivshmem]
  }.freeze

  module_function

  # the code: globs of such paths
  def globs(paths) = paths.map { |p| p.end_with?('.py') ? p : "#{p}/**/*.py" }
end
