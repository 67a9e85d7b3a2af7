# What the suites and the demo need from Debian (rakelib/prereqs.rb, Support.suite packages:):
#   rake lint:packages       every program a suite's code starts comes from a package it declares
#   rake check:fresh-root    each suite's and the demo's install step, alone, in a fresh Debian 12
#                            root (debootstrap; FRESH_ROOT=/work/fresh-root, ONLY=name,name)
#   rake check:fresh-machine ./dev demo then ./dev test from a fresh clone in a fresh Debian 12 root
#                            (TASKS=test,demo for the other order)
require 'json'

Support.lint('packages', order: 5, desc: 'Every program a suite or the demo starts is in a package it declares') do |name|
  Support.apt('apt', 'dpkg')
  suites = Support::PREREQS.to_h do |suite, (packages, code)|
    [suite, { 'packages' => packages, 'code' => Support.code_files(code) }]
  end
  out, st = Open3.capture2e(Support::SYSTEM_PYTHON, Support::PROGRAMS, 'lint', stdin_data: JSON.dump(suites),
                                                                                  chdir: Support::ROOT)
  Support.logged(name, 'printf', '%s', out)
  st.success?
end

namespace :check do
  desc 'Install each suite\'s and the demo\'s packages alone in a fresh Debian 12 root (FRESH_ROOT=, ONLY=)'
  task 'fresh-root' do
    names = ENV['ONLY'] ? ENV['ONLY'].split(',') : Support::PREREQS.keys.sort
    Support.apt('debootstrap')
    ok = Support.sh(File.join(Support::ROOT, 'dev-tools', 'fresh-root.sh'), *names) rescue false
    abort 'check:fresh-root: some install step failed (see the lines above)' unless ok
  end

  desc 'A new user\'s machine: fresh Debian 12 root, fresh clone, then ./dev demo and ./dev test (TASKS=demo,test)'
  task 'fresh-machine' do
    tasks = (ENV['TASKS'] || 'demo,test').split(',')
    Support.apt('debootstrap', 'git')
    ok = Support.sh(File.join(Support::ROOT, 'dev-tools', 'fresh-root.sh'), '--machine', *tasks) rescue false
    abort "check:fresh-machine: ./dev #{tasks.join(', ./dev ')} did not all pass (see the lines above)" unless ok
  end
end

Support.suite('tooling', order: 5,
              desc: 'The test tooling: programs found per suite, one-line missing prerequisites, the summary',
              # its test files name programs only as examples: no code to check
              packages: %w[python3-pytest python3-libvirt ruby rake apt]) do |name|
  Support.logged(name, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '--color=no', '-p', 'no:cacheprovider',
                 'tests/support/test_prereqs.py')
end
