# The host driver (kvm_sriov/, vmm/kvm-sriov/): its suites, lint, install, demo.
HOST_PACKAGES = %w[python3-libvirt python3-lxml python3-jinja2 python3-pytest].freeze

Support.suite('driver-unit', order: 10,
              desc: 'Driver rung 1: fake sysfs, pool, XML, protocol, actions on libvirt test driver') do |name|
  Support.apt(HOST_PACKAGES, 'libvirt-daemon')
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                 'tests/driver', '-m', 'not libvirt and not vfio')
end

Support.lint('python', order: 10, desc: 'pyflakes on the Python trees') do |name|
  Support.apt('python3-pyflakes')
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pyflakes', 'kvm_sriov', 'vmm', 'tests')
end
