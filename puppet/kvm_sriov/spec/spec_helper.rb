# rspec-puppet setup that works with Debian's packages only (no RubyGems, no
# Forge): the fixture modules are symlinks to this module and to the Debian
# puppet-module-* packages, made here so `rspec` alone is enough.
require 'fileutils'

MODULE_ROOT = File.expand_path('..', __dir__)
FIXTURES = File.join(__dir__, 'fixtures')
SYSTEM_MODULES = ENV.fetch('KVM_SRIOV_SYSTEM_MODULES', '/usr/share/puppet/modules')

FileUtils.mkdir_p(File.join(FIXTURES, 'modules'))
{ 'kvm_sriov' => MODULE_ROOT,
  'stdlib' => File.join(SYSTEM_MODULES, 'stdlib'),
  'augeas_core' => File.join(SYSTEM_MODULES, 'augeas_core') }.each do |name, target|
  link = File.join(FIXTURES, 'modules', name)
  raise "fixture module #{name}: #{target} is missing (apt-get install puppet-module-...)" unless File.directory?(target)
  next if File.symlink?(link) && File.readlink(link) == target
  FileUtils.rm_rf(link)
  File.symlink(target, link)
end

# Facts of OSes facterdb 1.12 lacks (Debian 12), generated on Debian 12.
ENV['FACTERDB_SEARCH_PATHS'] ||= File.join(FIXTURES, 'facts')

RSpec.configure { |c| c.mock_with :rspec } # before the helper, or it picks mocha
require 'puppetlabs_spec_helper/module_spec_helper'
require 'rspec-puppet-facts'
include RspecPuppetFacts

RSpec.configure do |c|
  c.default_facts = { 'networking' => { 'fqdn' => 'foo.example.com', 'hostname' => 'foo' } }
  c.hiera_config = File.join(MODULE_ROOT, 'hiera.yaml') if c.respond_to?(:hiera_config)
  c.before(:each) { Puppet[:strict] = :warning }
end

# Every OS of metadata.json must have facts, else rspec-puppet-facts yields
# nothing for it and the examples silently vanish.
SUPPORTED = on_supported_os
EXPECTED_OS = %w[debian-11-x86_64 debian-12-x86_64 ubuntu-20.04-x86_64 redhat-8-x86_64 redhat-9-x86_64 almalinux-8-x86_64].freeze
missing = EXPECTED_OS - SUPPORTED.keys
raise "no facts for #{missing.join(', ')} (facterdb / spec/fixtures/facts)" unless missing.empty?
