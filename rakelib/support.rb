# Helpers shared by the rakelib/*.rake files: package installs, the Python
# that has Debian's libvirt binding, and the suite registry behind `rake test`.
require 'fileutils'
require 'open3'
require_relative 'prereqs'

module Support
  ROOT = File.expand_path('..', __dir__)
  BUILD = File.join(ROOT, 'build')
  SYSTEM_PYTHON = '/usr/bin/python3' # Debian's: python3-libvirt lives here
  VENV = File.join(ROOT, '.venv')
  PROGRAMS = File.join(ROOT, 'dev-tools', 'programs.py')
  # not_in_test: why `rake test` leaves the suite out for now (it still runs as test:<name>);
  # packages: the Debian packages it needs, installed before it runs; code: the files
  # (globs, '!glob' to leave out) whose programs it starts, checked against them
  # lane: :beside for a suite that `rake test` runs in a second lane beside the others:
  # the nested-host suites, one after another (one nested QEMU keeps about one core
  # busy; two at once took twice as long each). :main puts a bench-* suite in the
  # first lane instead of on the quiet machine at the end (a side-by-side ratio).
  Suite = Struct.new(:name, :order, :desc, :block, :not_in_test, :packages, :code, :lane)
  SUITES = []
  LINTS = []
  # name -> [packages, code] of every suite and of the demo (lint:packages, check:fresh-root)
  PREREQS = {}

  # A prerequisite the machine lacks: its message is the one line a user sees.
  class Missing < StandardError; end

  module_function

  def sudo
    Process.uid.zero? ? [] : ['sudo']
  end

  # Install missing Debian packages (apt-get update once per run).
  def apt(*pkgs)
    missing = pkgs.flatten.reject do |p|
      out, = Open3.capture2e('dpkg-query', '-W', '-f=${Status}', p)
      out.include?('install ok installed')
    end
    return if missing.empty?
    unless @apt_updated
      system(*sudo, 'apt-get', 'update', '-qq') or
        raise Missing, "apt-get update failed, so #{missing.join(' ')} cannot be installed: run apt-get update"
      @apt_updated = true
    end
    env = { 'DEBIAN_FRONTEND' => 'noninteractive' }
    system(env, *sudo, 'apt-get', 'install', '-y', '-qq', '-o', 'DPkg::Lock::Timeout=600',
           '--no-install-recommends', *missing) or
      raise Missing, "could not install #{missing.join(' ')}: run apt-get install #{missing.join(' ')}"
  end

  def register_prereqs(name, packages, code)
    PREREQS[name] = [packages.flatten.uniq, code.flatten]
  end

  # The files a code list names (globs relative to ROOT; '!glob' leaves files out).
  def code_files(code)
    drop, keep = code.partition { |c| c.start_with?('!') }
    files = keep.flat_map { |g| Dir.glob(g, base: ROOT).sort }
    files - drop.flat_map { |g| Dir.glob(g[1..], base: ROOT) }
  end

  # Install what `name` declares, then make sure every program its code starts
  # is there: one line per missing program (and the package giving it), never a traceback.
  def prepare(name)
    packages, code = PREREQS.fetch(name)
    apt('python3', packages)
    raise Missing, "missing #{SYSTEM_PYTHON}: apt-get install python3" unless File.executable?(SYSTEM_PYTHON)
    return if code.empty?
    out, st = Open3.capture2e(SYSTEM_PYTHON, PROGRAMS, 'require', *packages, '--', *code_files(code), chdir: ROOT)
    raise Missing, out.strip.lines.map(&:strip).join('; ') unless st.success?
  end

  def sh(*cmd)
    if (buf = Thread.current[:lane_output])
      out, st = Open3.capture2e(*cmd)
      buf << out
      return true if st.success?
      raise "command failed (#{st.exitstatus}): #{cmd.join(' ')}"
    end
    system(*cmd) or raise "command failed (#{$?.exitstatus}): #{cmd.join(' ')}"
  end

  OUTPUT = Mutex.new

  # Print to the terminal: whole lines, never torn by the other lane.
  def say(text)
    OUTPUT.synchronize { $stdout.print(text); $stdout.flush }
  end

  # A venv on top of Debian's python3 (so python3-libvirt and friends stay
  # visible) for the few PyPI-only packages; returns its python.
  VENV_LOCK = Mutex.new

  def venv_python(pip: [])
    VENV_LOCK.synchronize { make_venv(pip) }
  end

  def make_venv(pip)
    apt('python3-venv', 'python3-pip')
    unless File.exist?(File.join(VENV, 'bin', 'python'))
      sh(SYSTEM_PYTHON, '-m', 'venv', '--system-site-packages', VENV)
    end
    py = File.join(VENV, 'bin', 'python')
    missing = pip.reject { |spec| system(py, '-c', "import importlib.metadata as m; m.version('#{spec.split(/[<>=!~\[]/).first}')", err: File::NULL) }
    sh(py, '-m', 'pip', 'install', '-q', *missing) unless missing.empty?
    py
  end

  # Register a test suite: `Support.suite('driver-unit', order: 10) { ... }`.
  # The block runs the suite and must raise (or return false) on failure.
  # Its output is teed to build/test-logs/<name>.log and the runner's closing
  # line (pytest, rspec, or "N passed, N failed") is read for the total.
  def suite(name, order:, desc:, not_in_test: nil, packages: [], code: [], lane: nil, &block)
    SUITES << Suite.new(name, order, desc, block, not_in_test, packages, code, lane)
    register_prereqs(name, packages, code)
    Rake.application.last_description = desc
    Rake::Task.define_task("test:#{name}") { run_suites([SUITES.find { |s| s.name == name }]) }
    Rake.application.last_description = "Install what test:#{name} needs and check its programs are there"
    Rake::Task.define_task("prereqs:#{name}") { prereqs_task(name) }
  end

  # prereqs:<name>: the install step alone (check:fresh-root runs it in a fresh Debian root).
  def prereqs_task(name)
    started = Time.now
    prepare(name)
    puts format('%s: prerequisites installed and present (%.1fs)', name, Time.now - started)
  rescue Missing => e
    abort "#{name}: #{e.message}"
  end

  def lint(name, order:, desc:, &block)
    LINTS << Suite.new(name, order, desc, block)
    Rake.application.last_description = desc
    Rake::Task.define_task("lint:#{name}") { run_suites([LINTS.find { |s| s.name == name }]) }
  end

  # Run a command, echo and log its output; returns true on exit 0.
  def logged(name, *cmd, env: {}, chdir: ROOT)
    FileUtils.mkdir_p(File.join(BUILD, 'test-logs'))
    log = File.join(BUILD, 'test-logs', "#{name}.log")
    ok = nil
    File.open(log, 'a') do |f|
      Open3.popen2e(env, *cmd, chdir: chdir) do |_in, out, wait|
        buf = Thread.current[:lane_output]
        out.each_line do |l|
          buf ? buf << l : say(l)
          f.print(l)
        end
        ok = wait.value.success?
      end
    end
    ok
  end

  # A rung-4 suite's start: OpenNebula there (else one line and a failed suite, never a
  # silent pass) and the guest image made.
  def rung4_ready(name, python: SYSTEM_PYTHON, check: %w[-m simhost.frontend --locate],
                  missing: 'no OpenNebula 7.4 to run (the line above says what to set)')
    unless logged(name, python, *check)
      setup_failed(name, missing)
      return false
    end
    sh(SYSTEM_PYTHON, '-m', 'simhost.guest_image')
    true
  end

  # A benchmark is one check: run it logged, and count its verdict (exit code).
  def bench(name, *cmd, env: {})
    ok = logged(name, *cmd, env: env)
    File.open(File.join(BUILD, 'test-logs', "#{name}.log"), 'a') do |f|
      f.puts(ok ? '1 passed, 0 failed' : '0 passed, 1 failed')
    end
    ok
  end

  def counts_from_log(name)
    path = File.join(BUILD, 'test-logs', "#{name}.log")
    return [0, 0] unless File.exist?(path)
    text = File.read(path, encoding: 'UTF-8', invalid: :replace, undef: :replace)
    passed = failed = 0
    errors = 0
    text.scan(/^[= ]*(\d+ (?:passed|failed|errors?|skipped|deselected)\b.*) in [\d.]+s/) do |(line)| # pytest
      passed += line[/(\d+) passed/, 1].to_i
      failed += line[/(\d+) failed/, 1].to_i + line[/(\d+) errors?/, 1].to_i
      errors += line[/(\d+) errors?/, 1].to_i
    end
    text.scan(/^(\d+) examples?, (\d+) failures?/) do |ex, fl| # rspec
      passed += ex.to_i - fl.to_i
      failed += fl.to_i
    end
    text.scan(/^(?:\w+: )?(\d+) passed, (\d+) failed/) do |p, fl| # plain
      passed += p.to_i
      failed += fl.to_i
    end
    # pytest's "ERROR at setup of ...": the suite's own set-up (a fixture) failed
    setup = (errors.positive? && text.match?(/^_+ ERROR at setup of /)) || text.lines.any? { |l| l.start_with?(SETUP_MARK) }
    failed = 1 if setup && failed.zero? # set up failed before any test could count
    [passed, failed, setup]
  end

  SETUP_MARK = 'kvm-sriov: set-up failed: '

  # A suite's install/program check failed: said in its log, so the summary names it.
  def setup_failed(name, message)
    FileUtils.mkdir_p(File.join(BUILD, 'test-logs'))
    File.open(File.join(BUILD, 'test-logs', "#{name}.log"), 'a') { |f| f.puts("#{SETUP_MARK}#{message}") }
    warn "#{name}: #{message}"
  end

  # One suite: its prerequisites (unless done already), then its block; the summary's row.
  def run_one(s, prepared: false)
    started = Time.now
    ok = begin
      prepare(s.name) if !prepared && PREREQS.key?(s.name)
      s.block.call(s.name) != false
    rescue Missing => e
      setup_failed(s.name, e.message)
      false
    rescue StandardError => e
      say("#{s.name}: #{e.message}\n")
      false
    end
    [s.name, ok, Time.now - started, *counts_from_log(s.name)]
  end

  def banner(s, note = '')
    "\n=== #{s.name}: #{s.desc}#{note} ===\n"
  end

  # `rake test`: every suite's installs and builds first (the first run's cost, printed
  # apart), then the nested-host suites in a lane of their own beside the others (each
  # nested QEMU keeps about one of the two cores busy), then the timing benchmarks on
  # a quiet machine. KVM_SRIOV_SERIAL=1 runs them one after another instead.
  def run_lanes(list)
    results = {}
    setup_started = Time.now
    say("\n=== set-up: every suite's packages and programs, shared images and builds ===\n")
    ready = list.select do |s|
      begin
        prepare(s.name) if PREREQS.key?(s.name)
        true
      rescue Missing => e
        setup_failed(s.name, e.message)
        results[s.name] = [s.name, false, 0.0, *counts_from_log(s.name)]
        false
      end
    end
    shared_builds(ready)
    setup = Time.now - setup_started
    say(format("set-up: %.1fs (installs and builds; near 0 once cached)\n", setup))
    beside, rest = ready.partition { |s| s.lane == :beside }
    quiet, main = rest.partition { |s| s.name.start_with?('bench-') && s.lane != :main }
    lane = Thread.new do
      beside.sort_by(&:order).each do |s|
        say("\n--- #{s.name} started in the second lane (its output follows when it ends) ---\n")
        Thread.current[:lane_output] = +''
        row = run_one(s, prepared: true)
        say(banner(s, ' [second lane]') + Thread.current[:lane_output])
        results[s.name] = row
      end
    end
    main.sort_by(&:order).each do |s|
      say(banner(s))
      results[s.name] = run_one(s, prepared: true)
    end
    lane.join
    quiet.sort_by(&:order).each do |s|
      say(banner(s, ' [quiet machine]'))
      results[s.name] = run_one(s, prepared: true)
    end
    [list.sort_by(&:order).map { |s| results[s.name] }.compact, setup]
  end

  # What several suites build or download (the guest kernel and initramfs, the nested
  # host's initramfs, OpenNebula, the venv with pyone): made once before the lanes start,
  # so that two never make it at once and the first run's cost is printed apart.
  def shared_builds(list)
    code = list.flat_map { |s| s.code || [] }
    return unless File.executable?(SYSTEM_PYTHON)
    if code.include?('simhost/guest_image.py')
      sh(SYSTEM_PYTHON, '-m', 'simhost.guest_image')
      sh(SYSTEM_PYTHON, '-c', 'from simhost.nested import ensure_l1_initrd; ensure_l1_initrd()')
    end
    return unless code.include?('simhost/frontend.py')
    # a missing OpenNebula is said by each suite that needs it (one line, a failed suite)
    system(venv_python(pip: ['pyone']), '-m', 'simhost.frontend', '--locate', chdir: ROOT)
  rescue StandardError => e
    say("set-up: shared images and builds not made (#{e.message}); the suites that need them will say so\n")
  end

  # Each failed suite's reasons (pytest's FAILED/ERROR lines, a set-up failure),
  # under the summary: a long run's log is cut in the middle, not at its end.
  def failures(names)
    return if names.empty?
    puts "\n=== what failed ==="
    names.each do |name|
      path = File.join(BUILD, 'test-logs', "#{name}.log")
      text = File.exist?(path) ? File.read(path, encoding: 'UTF-8', invalid: :replace, undef: :replace) : ''
      lines = text.lines.map(&:chomp).select { |l| l.start_with?('FAILED ', 'ERROR ', SETUP_MARK) }
      lines = text.lines.map(&:chomp).reject(&:empty?).last(3) if lines.empty?
      puts "- #{name}, its log #{path.delete_prefix("#{ROOT}/")}:"
      lines.first(6).each { |l| puts "    #{l.length > 400 ? "#{l[0, 400]}..." : l}" }
      puts "    ... #{lines.size - 6} more" if lines.size > 6
    end
  end

  def run_suites(list, all: false)
    wall = Time.now
    left_out, list = list.partition(&:not_in_test) if all
    # only these suites' logs: another run (a lint, a single suite) may be writing its own
    list.each { |s| FileUtils.rm_f(File.join(BUILD, 'test-logs', "#{s.name}.log")) }
    setup = nil
    if all && ENV['KVM_SRIOV_SERIAL'] != '1' && list.any? { |s| s.lane == :beside }
      results, setup = run_lanes(list)
    else
      results = list.sort_by(&:order).map do |s|
        say(banner(s))
        run_one(s)
      end
    end
    puts "\n=== summary ==="
    puts format('%-22s %-12s %7.1fs  (installs and builds before the suites)', 'set-up', '', setup) if setup
    lanes = list.to_h { |s| [s.name, s.lane] }
    results.each do |name, ok, secs, p, f, setup_failed|
      verdict = setup_failed && !ok ? 'SETUP FAILED' : (ok ? 'ok' : 'FAIL')
      beside = setup && lanes[name] == :beside ? '  (second lane)' : ''
      puts format('%-22s %-12s %7.1fs  %d passed, %d failed%s', name, verdict, secs, p, f, beside)
    end
    puts format('%-22s %-12s %7.1fs  (wall time of the whole run)', 'total', '', Time.now - wall)
    total_p = results.sum { |r| r[3] }
    total_f = results.sum { |r| r[4] }
    bad = results.reject { |r| r[1] }.map(&:first)
    total_f += 1 if !bad.empty? && total_f.zero? # a suite that broke without counting
    (left_out || []).each { |s| puts "#{s.name}: not run by `rake test`: #{s.not_in_test}" }
    failures(bad)
    puts "#{total_p} passed, #{total_f} failed"
    abort "failed: #{bad.join(', ')}" unless bad.empty?
  end
end
