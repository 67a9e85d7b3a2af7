# The demo (README's first command): the driver on simulated hosts inside the nested SR-IOV
# host (simhost/demo.py says what it shows). The nested host's root is this machine's, so the
# demo's hosts need what the driver's rung-2 suites need (DRIVER_SIM_*, prereqs.rb).
Support.register_prereqs('demo', DRIVER_SIM_PACKAGES,
                         [*DRIVER_SIM_CODE, 'simhost/demo.py', 'tests/ivshmem/guest.py', 'tests/ivshmem/guest_tool.py'])

module Demo
  module_function

  QUIET = 25 # seconds without a line before the watcher says the run is alive

  # Run cmd, passing its output through; while it prints nothing for QUIET seconds
  # (L1 booting, mostly: the demo inside says what it waits for), say so.
  def watched(cmd, started)
    last = Time.now
    lock = Mutex.new
    IO.popen(cmd, err: [:child, :out]) do |io|
      watcher = Thread.new do
        loop do
          sleep 5
          lock.synchronize do
            next if Time.now - last < QUIET
            puts format('  ... demo: still starting or running the nested host (%ds since the start)', Time.now - started)
            $stdout.flush
            last = Time.now
          end
        end
      end
      begin
        while (chunk = io.readpartial(4096))
          lock.synchronize do
            $stdout.write(chunk)
            $stdout.flush
            last = Time.now
          end
        end
      rescue EOFError
        nil
      ensure
        watcher.kill
      end
    end
    $?.success?
  end
end

desc 'Demo: the driver on a built-in simulated SR-IOV host (nested QEMU, no IB hardware needed)'
task :demo do
  begin
    Support.prepare('demo')
  rescue Support::Missing => e
    abort "demo: #{e.message}"
  end
  # first-run cost (kernel download, guest images, L1 initramfs), outside the timed demo
  system(Support::SYSTEM_PYTHON, '-m', 'simhost.demo', '--prepare', chdir: Support::ROOT) or
    abort 'demo: could not build what the demo boots (the line above says why)'
  started = Time.now
  # the front-end's part (install the driver into each host's remotes) runs here, natively
  system(Support::SYSTEM_PYTHON, '-m', 'simhost.demo', '--install', chdir: Support::ROOT) or
    abort 'demo: could not install the driver for the simulated hosts (the line above says why)'
  # the goal is 10 min wall on a quiet 2-core machine; the timeout leaves room for a busy one
  cmd = NestedHost.command(Support::SYSTEM_PYTHON, '-m', 'simhost.demo', timeout: 3600)
  ok = Demo.watched(cmd, started)
  puts format('demo: %s in %.0fs wall (nested host boot, steps 0-7 and power-off; first-run cost above)',
              ok ? 'passed' : 'FAILED', Time.now - started)
  $stdout.flush
  ok or abort "demo: failed (exit #{$?.exitstatus}); the lines above say which step"
end

desc 'Install what the demo needs and check its programs are there'
task 'prereqs:demo' do
  Support.prereqs_task('demo')
end
