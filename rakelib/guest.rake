# Guest side: one-context hooks for InfiniBand VFs, the subnet
# manager helper, OpenNebula templates. See docs/guest.md.
require_relative 'support'

GUEST_SHELL = %w[
  contextualization/loc-16-kvm-sriov-ib
  contextualization/net-16-kvm-sriov-ib
  contextualization/net-90-kvm-sriov-sm
  contextualization/kvm-sriov-ib.d/functions.sh
  contextualization/kvm-sriov-ib.d/kvm-sriov-ib-hotplug
  contextualization/sm/kvm-sriov-opensm
  contextualization/install.sh
  contextualization/make-bundle.sh
  templates/cluster/create-cluster.sh
  contextualization/hostfile/net-95-kvm-sriov-hostfile
  templates/oneflow/create-ib-mpi-cluster.sh
].freeze

GUEST_BUNDLE = File.join(Support::BUILD, 'guest', 'kvm-sriov-ib-context.sh')

Support.suite('guest', order: 20,
              desc: 'Guest IB context scripts (real ip in netns + fake sysfs), opensm config, templates',
              # iproute2/ethtool: the real tools the scripts drive; opensm: its own option
              # parser checks our config; shellcheck: the lint tests; curl: the hot-plug
              # handler's report to OneGate.
              packages: %w[python3-pytest shellcheck opensm iproute2 ethtool sudo curl], code: ['tests/guest/*.py']) do |name|
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-p', 'no:cacheprovider', 'tests/guest')
end

Support.lint('guest-shellcheck', order: 20, desc: 'shellcheck the guest scripts') do |name|
  Support.apt('shellcheck')
  Support.logged(name, 'shellcheck', '-x', '-P', 'SCRIPTDIR', *GUEST_SHELL) &&
    Support.logged(name, 'echo', "#{GUEST_SHELL.size} passed, 0 failed")
end

namespace :guest do
  desc "Build the self-extracting guest-scripts bundle (#{GUEST_BUNDLE.sub("#{Support::ROOT}/", '')})"
  task :bundle do
    Support.sh(File.join(Support::ROOT, 'contextualization', 'make-bundle.sh'), GUEST_BUNDLE)
  end
end
