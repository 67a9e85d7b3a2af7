# rake install [REMOTES=/var/lib/one/remotes] [DESTDIR=] [OWNER=user] [GROUP=group]
# Lays the driver out the way OpenNebula's remotes expect it (docs/conventions.md);
# `onehost sync` then copies it to every host's /var/tmp/one. An existing
# kvm-sriov.toml is kept: it is the site's configuration.
#
# Ownership: every installed file and directory belongs to the owner of the
# remotes directory (OpenNebula's oneadmin, who runs this code and whose
# `onehost sync` copies it), or OWNER/GROUP, never to whoever owns the
# checkout (that account could otherwise change what oneadmin runs on every
# host); modes are set, not copied: directories and executables 0755, other
# files 0644. Only root can give files away: run as another user, the files
# are that user's. Other parts add their own steps by enhancing `task :install`
# and use KvmSriovInstall.owner / .make_dirs / .install_file for the same rules.
require 'etc'

desc 'Install the driver into OpenNebula remotes (REMOTES=/var/lib/one/remotes, DESTDIR=, OWNER=, GROUP=)'
task :install do
  remotes = KvmSriovInstall.remotes
  KvmSriovInstall.run(Support::ROOT, remotes)
  puts "installed kvm-sriov into #{remotes} (owner #{KvmSriovInstall.owner(remotes).join(':')})"
end

# The VM_MAD's defaults file, on the front-end: OpenNebula's own
# vmm_exec_kvm.conf with kvm-sriov's values (templates/oned/vmm_exec_kvm-sriov.conf)
# set in it (kvm_sriov/oned_defaults.py); made from the operator's installed
# file, so every stock default of that OpenNebula version stays.
namespace :install do
  desc 'Write ONE_ETC/vmm_exec/vmm_exec_kvm-sriov.conf from the stock vmm_exec_kvm.conf ' \
       '(ONE_ETC=/etc/one, STOCK_VMM_CONF=, DESTDIR=, OWNER=, GROUP=)'
  task :oned_defaults do
    etc = ENV.fetch('ONE_ETC', '/etc/one')
    stock = ENV.fetch('STOCK_VMM_CONF', File.join(etc, 'vmm_exec', 'vmm_exec_kvm.conf'))
    unless File.file?(stock)
      abort "kvm-sriov: OpenNebula's #{stock} not found: the kvm-sriov defaults are made from it " \
            '(ONE_ETC= names OpenNebula\'s etc directory, STOCK_VMM_CONF= the file itself)'
    end
    dir = File.join(ENV.fetch('DESTDIR', ''), etc, 'vmm_exec')
    ids = KvmSriovInstall.owner(dir)
    KvmSriovInstall.make_dirs(dir, ids)
    out = File.join(dir, 'vmm_exec_kvm-sriov.conf')
    Dir.chdir(Support::ROOT) do
      Support.sh(Support::SYSTEM_PYTHON, '-m', 'kvm_sriov.oned_defaults', stock,
                 File.join(Support::ROOT, 'templates', 'oned', 'vmm_exec_kvm-sriov.conf'), out)
    end
    KvmSriovInstall.settle(out, ids)
  end
end

module KvmSriovInstall
  module_function

  def remotes
    File.join(ENV.fetch('DESTDIR', ''), ENV.fetch('REMOTES', '/var/lib/one/remotes'))
  end

  # [uid, gid] the installed files get: OWNER/GROUP, else the remotes
  # directory's (or its nearest existing parent's) owner.
  def owner(remotes)
    dir = remotes
    dir = File.dirname(dir) until File.exist?(dir) || dir == File.dirname(dir)
    st = File.stat(dir)
    uid = ENV['OWNER'] ? Etc.getpwnam(ENV['OWNER']).uid : st.uid
    gid = ENV['GROUP'] ? Etc.getgrnam(ENV['GROUP']).gid : (ENV['OWNER'] ? Etc.getpwnam(ENV['OWNER']).gid : st.gid)
    [uid, gid]
  end

  def mode_for(path)
    File.directory?(path) || File.executable?(path) ? 0o755 : 0o644
  end

  # Mode and owner of one installed path (owner only as root).
  def settle(path, ids)
    File.chmod(mode_for(path), path)
    File.lchown(*ids, path) if Process.euid.zero?
  end

  # mkdir -p, where each directory it makes gets the installation's owner and 0755.
  def make_dirs(dir, ids)
    missing = []
    d = dir
    until File.directory?(d) || d == File.dirname(d)
      missing.unshift(d)
      d = File.dirname(d)
    end
    missing.each do |m|
      Dir.mkdir(m)
      settle(m, ids)
    end
  end

  # One file, with explicit mode and the installation's owner.
  def install_file(src, dst_dir, ids, mode: nil)
    make_dirs(dst_dir, ids)
    dst = File.join(dst_dir, File.basename(src))
    FileUtils.cp(src, dst)
    File.chmod(mode || mode_for(src), dst)
    File.lchown(*ids, dst) if Process.euid.zero?
    dst
  end

  def copy_tree(src, dst, ids)
    make_dirs(dst, ids)
    settle(dst, ids)
    Dir.glob('**/*', base: src).sort.each do |rel|
      next if rel.split('/').any? { |part| part == '__pycache__' } || rel.end_with?('.pyc')
      from = File.join(src, rel)
      to = File.join(dst, rel)
      if File.directory?(from)
        make_dirs(to, ids)
        settle(to, ids)
      else
        install_file(from, File.dirname(to), ids, mode: mode_for(from))
      end
    end
  end

  def run(root, remotes)
    ids = owner(remotes)
    drv = File.join(remotes, 'vmm', 'kvm-sriov')
    FileUtils.rm_rf(File.join(drv, 'lib', 'kvm_sriov')) # no stale modules from an older version
    copy_tree(File.join(root, 'vmm', 'kvm-sriov'), drv, ids)
    copy_tree(File.join(root, 'kvm_sriov'), File.join(drv, 'lib', 'kvm_sriov'), ids)
    settle(File.join(drv, 'lib'), ids)
    conf_dir = File.join(remotes, 'etc', 'vmm', 'kvm-sriov')
    make_dirs(conf_dir, ids)
    settle(conf_dir, ids)
    conf = File.join(conf_dir, 'kvm-sriov.toml')
    install_file(File.join(root, 'etc', 'vmm', 'kvm-sriov', 'kvm-sriov.toml'), conf_dir, ids) unless File.exist?(conf)
    im = File.join(root, 'im')
    copy_tree(im, File.join(remotes, 'im'), ids) if Dir.exist?(im) && !Dir.empty?(im)
    precompile(drv, ids)
  end

  # Every action is a fresh interpreter: bytecode shipped with the remotes
  # saves recompiling the library on each call where it cannot be cached
  # (read-only remotes, PYTHONDONTWRITEBYTECODE). Hash-checked, so the copies
  # `onehost sync` makes stay valid whatever their mtimes.
  def precompile(drv, ids)
    ok = system(Support::SYSTEM_PYTHON, '-m', 'compileall', '-q', '--invalidation-mode', 'checked-hash', drv,
                out: File::NULL)
    warn "kvm-sriov: could not precompile #{drv}; the scripts still work, each call compiles" unless ok
    Dir.glob(['**/__pycache__', '**/__pycache__/*'], base: drv).each { |rel| settle(File.join(drv, rel), ids) }
  end
end
