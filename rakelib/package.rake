# ./dev package: Debian packages (front-end, host, command line) and the same
# three as RPMs, built from this tree into dist/ (docs/packaging.md).
#
# The front-end's remotes are laid out by the `install` task itself (the same
# code as `rake install`: install.rake + sched.rake), into a staging root
# owned by root; the packages then hold files owned by root, which oneadmin
# reads and `onehost sync` copies, but cannot change.
require 'tmpdir'
require 'zlib'
require 'digest'
require 'stringio'

module KvmSriovPackage
  DIST = ENV.fetch('PACKAGE_DIST', File.join(Support::ROOT, 'dist'))
  PKG = File.join(Support::ROOT, 'packaging')
  REMOTES = '/var/lib/one/remotes'
  FRONTEND = 'opennebula-kvm-sriov'
  NODE = 'opennebula-node-kvm-sriov'
  TOOLS = 'opennebula-kvm-sriov-tools'
  NAMES = [FRONTEND, NODE, TOOLS].freeze
  # Debian's tools: dpkg-deb, lintian; RHEL's as Debian ships them: rpmbuild (rpm), rpmlint
  FORMATS = ENV.fetch('PACKAGE_FORMATS', 'deb rpm').split
  PACKAGES = %w[dpkg-dev lintian rpm rpmlint fakeroot].freeze
  # what building each format needs (dpkg-deb is dpkg's, in every Debian); the
  # rest of PACKAGES checks the packages (the package suite)
  BUILD_PACKAGES = { 'deb' => [], 'rpm' => %w[rpm] }.freeze
  DOCS = %w[README.md docs/install.md docs/packaging.md docs/conventions.md docs/scheduling.md
            docs/infiniband.md docs/ivshmem.md docs/guest.md docs/metrics.md kvm_sriov/supported-opennebula.txt].freeze
  ROOT_IDS = [0, 0].freeze

  module_function

  def version
    ENV['PACKAGE_VERSION'] || File.read(File.join(Support::ROOT, 'pyproject.toml'))[/^version\s*=\s*"([^"]+)"/, 1]
  end

  # Debian revision 1, RPM release 1.
  def deb_version
    "#{version}-1"
  end

  # The tree's last commit time, so two builds of one commit are the same bytes where the tools allow.
  def epoch
    (ENV['SOURCE_DATE_EPOCH'] || `git -C #{Support::ROOT} log -1 --format=%ct 2>/dev/null`.strip).then do |t|
      t.empty? ? Time.now.to_i : t.to_i
    end
  end

  def with_env(vars)
    old = vars.keys.to_h { |k| [k, ENV[k]] }
    vars.each { |k, v| ENV[k] = v }
    yield
  ensure
    old.each { |k, v| ENV[k] = v }
  end

  def put(root, path, data, mode)
    dst = File.join(root, path)
    FileUtils.mkdir_p(File.dirname(dst), mode: 0o755)
    File.binwrite(dst, data)
    File.chmod(mode, dst)
  end

  def copy(root, src, path, mode = nil)
    data = File.binread(File.join(Support::ROOT, src))
    put(root, path, data, mode || (File.executable?(File.join(Support::ROOT, src)) ? 0o755 : 0o644))
  end

  def tree(root, src, path)
    dst = File.join(root, path)
    FileUtils.mkdir_p(dst, mode: 0o755)
    KvmSriovInstall.copy_tree(File.join(Support::ROOT, src), dst, ROOT_IDS)
  end

  # remotes (as rake install lays them), the cluster-wide config as a conffile
  # in /etc/one/kvm-sriov with a link to it where the driver reads it, templates.
  def stage_frontend(root)
    with_env('DESTDIR' => root, 'REMOTES' => REMOTES, 'OWNER' => 'root', 'GROUP' => 'root') do
      Rake::Task['install'].reenable
      Rake::Task['install'].invoke
    end
    recompile(root, File.join(REMOTES, 'vmm', 'kvm-sriov'))
    link = File.join(root, REMOTES, 'etc', 'vmm', 'kvm-sriov', 'kvm-sriov.toml')
    put(root, 'etc/one/kvm-sriov/kvm-sriov.toml', File.binread(link), 0o644)
    File.unlink(link)
    File.symlink('/etc/one/kvm-sriov/kvm-sriov.toml', link)
    tree(root, 'templates', 'usr/share/kvm-sriov/templates')
    tree(root, 'monitoring', 'usr/share/kvm-sriov/monitoring')   # Grafana dashboard, Prometheus rules
  end

  # rake install compiles in the staging root: the bytecode would name the
  # staging path in tracebacks, so it is made again naming the installed one.
  def recompile(root, drv)
    Dir.glob(File.join(root, drv, '**', '__pycache__')).each { |d| FileUtils.rm_rf(d) }
    Support.sh(Support::SYSTEM_PYTHON, '-m', 'compileall', '-q', '--invalidation-mode', 'checked-hash',
               '-s', root, '-p', '/', File.join(root, drv), out: File::NULL)
  end

  def stage_tools(root, systemd: 'lib/systemd/system')
    copy(root, 'bin/kvm-sriov', 'usr/lib/kvm-sriov/bin/kvm-sriov', 0o755)
    %w[service timer].each do |unit|   # `kvm-sriov metrics` every 30 s, on hosts and the front-end alike
      copy(root, "packaging/metrics/kvm-sriov-metrics.#{unit}", "#{systemd}/kvm-sriov-metrics.#{unit}", 0o644)
    end
    tree(root, 'kvm_sriov', 'usr/lib/kvm-sriov/kvm_sriov')
    copy(root, 'kvm_sriov_bootstrap.py', 'usr/lib/kvm-sriov/kvm_sriov_bootstrap.py', 0o644) # what the CLI imports first
    FileUtils.mkdir_p(File.join(root, 'usr/bin'))
    File.symlink('../lib/kvm-sriov/bin/kvm-sriov', File.join(root, 'usr/bin/kvm-sriov'))
  end

  def stage_node(root, systemd: 'lib/systemd/system', udev: 'lib/udev/rules.d')
    copy(root, 'puppet/kvm_sriov/files/kvm-sriov-vfs', 'usr/sbin/kvm-sriov-vfs', 0o755)
    copy(root, 'packaging/host/kvm-sriov-vfs.service', "#{systemd}/kvm-sriov-vfs.service", 0o644)
    copy(root, 'packaging/host/70-kvm-sriov-vfio.rules', "#{udev}/70-kvm-sriov-vfio.rules", 0o644)
    copy(root, 'packaging/host/modules-load.conf', 'usr/lib/modules-load.d/kvm-sriov.conf', 0o644)
    copy(root, 'packaging/host/kvm-sriov.toml', 'etc/kvm-sriov/kvm-sriov.toml', 0o644)
    FileUtils.mkdir_p(File.join(root, 'etc/kvm-sriov/vfs.d'), mode: 0o755)
  end

  def changelog(name)
    date = Time.at(epoch).utc.strftime('%a, %d %b %Y %H:%M:%S +0000')
    "#{name} (#{deb_version}) unstable; urgency=medium\n\n" \
      "  * Built from the kvm-sriov source tree (./dev package).\n\n" \
      " -- kvm-sriov maintainers <kvm-sriov@example.invalid>  #{date}\n"
  end

  def gzip(data)
    io = StringIO.new
    gz = Zlib::GzipWriter.new(io, 9)
    gz.mtime = epoch
    gz.write(data)
    gz.close
    io.string
  end

  def debian_docs(root, name)
    doc = "usr/share/doc/#{name}"
    copy(root, 'packaging/copyright', "#{doc}/copyright", 0o644)
    put(root, "#{doc}/changelog.Debian.gz", gzip(changelog(name)), 0o644)
    DOCS.each { |d| copy(root, d, "#{doc}/#{File.basename(d)}", 0o644) if File.exist?(File.join(Support::ROOT, d)) } if name == FRONTEND
    copy(root, 'docs/install.md', "#{doc}/install.md", 0o644) if name == NODE
    copy(root, 'docs/metrics.md', "#{doc}/metrics.md", 0o644) if name == TOOLS
    overrides = File.join(PKG, 'deb', name, 'lintian-overrides')
    copy(root, "packaging/deb/#{name}/lintian-overrides", "usr/share/lintian/overrides/#{name}", 0o644) if File.exist?(overrides)
  end

  def files_under(root)
    Dir.glob('**/*', File::FNM_DOTMATCH, base: root).reject { |p| p.start_with?('DEBIAN') || File.basename(p) == '.' }.sort
  end

  def debian_control(root, name)
    dir = File.join(root, 'DEBIAN')
    FileUtils.mkdir_p(dir, mode: 0o755)
    size = files_under(root).sum { |p| File.lstat(File.join(root, p)).then { |s| s.file? ? (s.size + 1023) / 1024 : 1 } }
    control = File.read(File.join(PKG, 'deb', name, 'control.in'))
                  .gsub('@VERSION@', deb_version).gsub('@SIZE@', size.to_s)
    put(root, 'DEBIAN/control', control, 0o644)
    conffiles = files_under(root).select { |p| p.start_with?('etc/') && File.file?(File.join(root, p)) && !File.symlink?(File.join(root, p)) }
    put(root, 'DEBIAN/conffiles', conffiles.map { |p| "/#{p}\n" }.join, 0o644) unless conffiles.empty?
    sums = files_under(root).select { |p| File.file?(File.join(root, p)) && !File.symlink?(File.join(root, p)) }
                            .map { |p| "#{Digest::MD5.file(File.join(root, p)).hexdigest}  #{p}\n" }
    put(root, 'DEBIAN/md5sums', sums.join, 0o644)
    %w[preinst postinst prerm postrm].each do |s|
      src = File.join(PKG, 'deb', name, s)
      copy(root, "packaging/deb/#{name}/#{s}", "DEBIAN/#{s}", 0o755) if File.exist?(src)
    end
  end

  def normalize(root)
    Dir.glob('**/*', File::FNM_DOTMATCH, base: root).each do |p|
      path = File.join(root, p)
      next if File.symlink?(path)
      File.chmod(File.directory?(path) ? 0o755 : (File.stat(path).mode & 0o777), path)
      File.lutime(epoch, epoch, path) rescue nil
    end
  end

  def stage(name, root)
    case name
    when FRONTEND then stage_frontend(root)
    when NODE then stage_node(root)
    when TOOLS then stage_tools(root)
    end
  end

  def build_deb(name, work)
    root = File.join(work, 'deb', name)
    FileUtils.mkdir_p(root, mode: 0o755)
    stage(name, root)
    debian_docs(root, name)
    debian_control(root, name)
    normalize(root)
    out = File.join(DIST, "#{name}_#{deb_version}_all.deb")
    Support.sh('dpkg-deb', '--root-owner-group', '-Zxz', '--build', root, out, out: File::NULL)
    out
  end

  # One staging root per package with RHEL's paths; the spec installs them as they are.
  def build_rpms(work)
    stages = File.join(work, 'rpm-stage')
    NAMES.each do |name|
      root = File.join(stages, name)
      FileUtils.mkdir_p(root, mode: 0o755)
      if name == NODE
        stage_node(root, systemd: 'usr/lib/systemd/system', udev: 'usr/lib/udev/rules.d')
      elsif name == TOOLS
        stage_tools(root, systemd: 'usr/lib/systemd/system')
      else
        stage(name, root)
      end
      normalize(root)
    end
    top = File.join(work, 'rpmbuild')
    %w[BUILD RPMS SOURCES SPECS SRPMS BUILDROOT].each { |d| FileUtils.mkdir_p(File.join(top, d)) }
    FileUtils.cp(DOCS.map { |d| File.join(Support::ROOT, d) }.select { |d| File.exist?(d) }, File.join(top, 'SOURCES'))
    FileUtils.cp(File.join(PKG, 'copyright'), File.join(top, 'SOURCES'))
    Support.sh('rpmbuild', '-bb', '--quiet', '--define', "_topdir #{top}", '--define', "stage #{stages}",
               '--define', "packaging #{PKG}",
               '--define', "pkg_version #{version}", '--define', "source_date_epoch #{epoch}",
               '--define', '_build_id_links none',
               File.join(PKG, 'rpm', 'opennebula-kvm-sriov.spec'), out: File::NULL)
    Dir.glob(File.join(top, 'RPMS', '*', '*.rpm')).map do |rpm|
      FileUtils.cp(rpm, DIST)
      File.join(DIST, File.basename(rpm))
    end
  end

  def build
    Support.apt(*FORMATS.flat_map { |f| BUILD_PACKAGES.fetch(f, []) })
    FileUtils.mkdir_p(DIST)
    NAMES.each { |n| Dir.glob(File.join(DIST, "#{n}[_-][0-9]*")).each { |f| File.unlink(f) } }
    Dir.mktmpdir('kvm-sriov-package.') do |work|
      File.chmod(0o755, work)
      debs = FORMATS.include?('deb') ? NAMES.map { |n| build_deb(n, work) } : []
      rpms = FORMATS.include?('rpm') ? build_rpms(work) : []
      (debs + rpms).each { |f| puts "built #{f.delete_prefix("#{Support::ROOT}/")}" }
    end
  end
end

desc 'Build the Debian packages and RPMs of the front-end, host and CLI into dist/ (PACKAGE_VERSION=)'
task :package do
  KvmSriovPackage.build
rescue Support::Missing => e
  abort "package: #{e.message}"
end

# ruby: test_oned_conf runs one_sched's own option table with Ruby's GetoptLong.
Support.suite('package', order: 28,
                         desc: 'Packages: build .deb and .rpm, lintian, rpmlint, install/upgrade/remove in a ' \
                               'throwaway dpkg root, setup-frontend on the real oned.conf',
                         # python3-venv ... matplotlib: test_wheel installs a wheel from pyproject.toml
                         # in a venv over Debian's site packages and imports every module there
                         packages: KvmSriovPackage::PACKAGES + %w[python3-pytest ruby python3-venv python3-pip
                                                                  python3-setuptools python3-libvirt python3-numpy
                                                                  python3-scipy python3-matplotlib],
                         code: %w[tests/packaging/*.py !tests/packaging/test_ansible.py kvm_sriov/frontend/oned_conf.py kvm_sriov/oned/versions.py]) do |log|
  Support.logged(log, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                 'tests/packaging/test_oned_conf.py', 'tests/packaging/test_versions.py',
                 'tests/packaging/test_packages.py', 'tests/packaging/test_wheel.py')
end

# The Ansible roles (ansible/): a real ansible-playbook run into a throwaway
# root, twice (the second changes nothing), the files compared with Puppet's,
# and ansible-lint (PyPI, in .venv).
Support.suite('ansible', order: 31,
                         desc: 'Ansible roles: real run into a throwaway root, idempotence, same files as Puppet, ansible-lint',
                         packages: %w[ansible rake python3-pytest puppet-agent puppet-module-puppetlabs-stdlib
                                      puppet-module-puppetlabs-augeas-core augeas-lenses ruby-augeas],
                         code: %w[tests/packaging/test_ansible.py]) do |log|
  Support.venv_python(pip: ['ansible-lint'])
  Support.logged(log, Support::SYSTEM_PYTHON, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                 'tests/packaging/test_ansible.py')
end
