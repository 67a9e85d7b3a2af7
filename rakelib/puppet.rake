# Puppet modules (puppet/<module>): rspec-puppet catalog tests, syntax,
# style, metadata and a real apply of the host/front-end classes into a
# throwaway root, and of the subnet manager's partitions exec with the real
# opensm judging the file. Debian packages only (no Forge, no RubyGems); see
# docs/puppet.md.
module PuppetSuite
  MODULES = Dir[File.join(Support::ROOT, 'puppet', '*', 'metadata.json')].map { |m| File.dirname(m) }.sort
  SYSTEM_MODULES = '/usr/share/puppet/modules'
  PACKAGES = %w[
    puppet-agent puppet-lint ruby-rspec-puppet ruby-rspec-puppet-facts
    ruby-puppetlabs-spec-helper ruby-puppet-syntax facterdb metadata-json-lint
    puppet-module-puppetlabs-stdlib puppet-module-puppetlabs-augeas-core
    puppet-strings augeas-lenses ruby-augeas shellcheck
    opensm ibsim-utils libumad2sim0 python3-lxml
  ].freeze

  module_function

  def install
    Support.apt(*PACKAGES)
  end

  def files(mod, glob)
    Dir[File.join(mod, glob)].sort
  end

  # Static checks; each step logged under the suite's name. Returns true if all pass.
  def static(log)
    MODULES.all? do |mod|
      name = File.basename(mod)
      manifests = files(mod, '{manifests,functions,types}/**/*.pp')
      templates = files(mod, 'templates/**/*.epp')
      scripts = files(mod, 'files/*') + files(mod, 'spec/apply/*.sh')
      [
        Support.logged(log, 'puppet', 'parser', 'validate', *manifests),
        Support.logged(log, 'puppet', 'epp', 'validate', *templates),
        Support.logged(log, 'puppet-lint', '--fail-on-warnings', '--relative', *manifests, chdir: mod),
        Support.logged(log, 'metadata-json-lint', '--strict-license', 'metadata.json', chdir: mod),
        Support.logged(log, 'shellcheck', '-e', 'SC2317', *scripts),
        reference_current?(log, mod),
      ].all?.tap { |ok| puts "#{name}: static checks #{ok ? 'ok' : 'FAILED'}" }
    end
  end

  # REFERENCE.md is what `puppet strings generate --format markdown` makes.
  def reference_current?(log, mod)
    out = File.join(Support::BUILD, "puppet-#{File.basename(mod)}-REFERENCE.md")
    FileUtils.mkdir_p(Support::BUILD)
    Support.logged(log, 'puppet', 'strings', 'generate', '--format', 'markdown', '--out', out, chdir: mod) or return false
    current = File.read(out) == File.read(File.join(mod, 'REFERENCE.md'))
    warn "#{File.basename(mod)}: REFERENCE.md is stale: run `puppet strings generate --format markdown` in #{mod}" unless current
    current
  end

  # rspec-puppet; a run of 0 examples is a failure (facterdb without the
  # OSes of metadata.json yields nothing and rspec would say "0 failures").
  def rspec(log)
    MODULES.all? do |mod|
      out = File.join(Support::BUILD, "puppet-#{File.basename(mod)}-rspec.txt")
      FileUtils.mkdir_p(Support::BUILD)
      ok = Support.logged(log, 'rspec', '--format', 'progress', '--no-color',
                          '--format', 'progress', '--out', out, chdir: mod)
      text = File.exist?(out) ? File.read(out) : ''
      examples = text[/^(\d+) examples?, \d+ failures?/, 1].to_i
      if examples.zero?
        warn "#{File.basename(mod)}: rspec ran 0 examples: failing"
        ok = false
      end
      ok
    end
  end

  def apply(log)
    mod = File.join(Support::ROOT, 'puppet', 'kvm_sriov')
    Support.logged(log, *Support.sudo, File.join(mod, 'spec', 'apply', 'apply_test.sh'), mod, SYSTEM_MODULES)
  end
end

Support.suite('puppet', order: 30,
                        desc: 'Puppet modules: rspec-puppet on every supported OS, parser/epp validate, ' \
                              'puppet-lint, metadata-json-lint, real apply into a throwaway root',
                        packages: PuppetSuite::PACKAGES) do |log|
  static = PuppetSuite.static(log)
  specs = PuppetSuite.rspec(log)
  applied = PuppetSuite.apply(log)
  static && specs && applied
end

Support.lint('puppet', order: 30, desc: 'Puppet modules: parser/epp validate, puppet-lint, metadata-json-lint, shellcheck') do |log|
  PuppetSuite.install
  PuppetSuite.static(log)
end

namespace :puppet do
  desc 'Puppet: only the rspec-puppet examples (faster loop while editing)'
  task :spec do
    PuppetSuite.install
    PuppetSuite.rspec('puppet-spec') or abort 'puppet rspec failed'
  end
end
