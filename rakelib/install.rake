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
#
# Symlinks: root writes into a tree that another account (oneadmin) owns, and
# copies from a checkout that another account may own, so neither side's
# symlinks are followed. Each path is walked one directory at a time from a
# descriptor (KvmSriovInstall::OpenDir), never by name, so a directory swapped
# for a symlink after a check is not written through either: a symlinked
# directory is refused with the path named; a file is written under a
# temporary name and renamed over the old one (a symlink there is replaced,
# its target untouched); modes and owners are set on open descriptors. The
# only symlinks followed are root's own (owned by root, in a directory only
# root can write), such as /var/lib/one -> /srv/one. A symlink, FIFO or device
# in the checkout stops the installation: its target is never installed.
require 'etc'

desc 'Install the driver into OpenNebula remotes (REMOTES=/var/lib/one/remotes, DESTDIR=, OWNER=, GROUP=)'
task :install do
  remotes = KvmSriovInstall.remotes
  KvmSriovInstall.guard { KvmSriovInstall.run(Support::ROOT, remotes) }
  puts "installed kvm-sriov into #{remotes} (owner #{KvmSriovInstall.owner(remotes).join(':')})"
end

# The VM_MAD's defaults file, on the front-end: OpenNebula's own
# vmm_exec_kvm.conf with kvm-sriov's values (templates/oned/vmm_exec_kvm-sriov.conf)
# set in it (kvm_sriov/oned/oned_defaults.py); made from the operator's installed
# file, so every stock default of that OpenNebula version stays. It is made in
# a directory only root can enter, then installed like the remotes' files.
namespace :install do
  desc 'Write ONE_ETC/vmm_exec/vmm_exec_kvm-sriov.conf from the stock vmm_exec_kvm.conf ' \
       '(ONE_ETC=/etc/one, STOCK_VMM_CONF=, DESTDIR=, OWNER=, GROUP=)'
  task :oned_defaults do
    require 'tmpdir'
    etc = ENV.fetch('ONE_ETC', '/etc/one')
    stock = ENV.fetch('STOCK_VMM_CONF', File.join(etc, 'vmm_exec', 'vmm_exec_kvm.conf'))
    unless File.file?(stock)
      abort "kvm-sriov: OpenNebula's #{stock} not found: the kvm-sriov defaults are made from it " \
            '(ONE_ETC= names OpenNebula\'s etc directory, STOCK_VMM_CONF= the file itself)'
    end
    dir = File.join(ENV.fetch('DESTDIR', ''), etc, 'vmm_exec')
    ids = KvmSriovInstall.owner(dir)
    KvmSriovInstall.guard do
      KvmSriovInstall.check_source(stock) # no symlink of another account's on the way
      Dir.mktmpdir('kvm-sriov-oned-defaults.') do |tmp|
        made = File.join(tmp, 'vmm_exec_kvm-sriov.conf')
        Dir.chdir(Support::ROOT) do
          Support.sh(Support::SYSTEM_PYTHON, '-m', 'kvm_sriov.oned.oned_defaults', stock,
                     File.join(Support::ROOT, 'templates', 'oned', 'vmm_exec_kvm-sriov.conf'), made)
        end
        KvmSriovInstall.install_file(made, dir, ids, mode: 0o644)
      end
    end
    puts "installed #{File.join(dir, 'vmm_exec_kvm-sriov.conf')}"
  end
end

module KvmSriovInstall
  module_function

  # What the installation will not do, said in one line (no backtrace).
  class Refused < StandardError; end

  def guard
    yield
  rescue Refused, SystemCallError => e
    abort "kvm-sriov install: #{e.message}"
  end

  # A directory held open; names below it are resolved from the descriptor
  # (/proc/self/fd/N/name: openat by path), one level at a time.
  class OpenDir
    attr_reader :path

    def initialize(io, path)
      @io = io
      @path = path
    end

    def at(name)
      raise Refused, "bad name #{name.inspect} under #{@path}" if name.empty? || name.include?('/') || %w[. ..].include?(name)
      "/proc/self/fd/#{@io.fileno}/#{name}"
    end

    def lstat(name)
      File.lstat(at(name))
    rescue Errno::ENOENT
      nil
    end

    def stat
      @io.stat
    end

    def children
      ::Dir.children("/proc/self/fd/#{@io.fileno}").sort
    end

    def chmod(mode)
      @io.chmod(mode)
    end

    def chown(uid, gid)
      @io.chown(uid, gid)
    end

    def close
      @io.close unless @io.closed?
    end
  end

  NOFOLLOW = File::RDONLY | File::NOFOLLOW | File::NONBLOCK

  # Open an existing entry of `parent` without following a symlink there
  # (ELOOP); `want` is :directory or :file.
  def open_entry(parent, name, want)
    path = File.join(parent.path, name)
    io = File.open(parent.at(name), NOFOLLOW)
    st = io.stat
    ok = want == :directory ? st.directory? : st.file?
    unless ok
      io.close
      raise Refused, "#{path} is not a #{want == :directory ? 'directory' : 'regular file'}"
    end
    want == :directory ? OpenDir.new(io, path) : io.binmode
  rescue Errno::ELOOP
    raise Refused, "#{path} is a symlink: refusing to follow it (replace it with a real " \
                   "#{want == :directory ? 'directory' : 'file'}, or name the real path)"
  end

  # root's own link: the link and the directory holding it are root's, and
  # nobody else can write that directory.
  def roots_own_link?(parent, name)
    st = parent.lstat(name)
    dir = parent.stat
    st&.symlink? && st.uid.zero? && dir.uid.zero? && (dir.mode & 0o022).zero?
  end

  # The directory at the absolute `path`, walked from /; with `ids`, missing
  # directories are made (0755, owned by ids).
  def open_path(path, ids = nil)
    raise Refused, "/proc is needed to install safely (mount it)" unless File.directory?('/proc/self/fd')
    dir = OpenDir.new(File.open('/', NOFOLLOW), '/')
    File.expand_path(path).split('/').reject(&:empty?).each do |name|
      parent = dir
      if roots_own_link?(parent, name)
        dir = OpenDir.new(File.open(File.realpath(parent.at(name)), NOFOLLOW), File.join(parent.path, name))
        raise Refused, "#{dir.path} is not a directory" unless dir.stat.directory?
      else
        made = false
        if ids && parent.lstat(name).nil?
          ::Dir.mkdir(parent.at(name), 0o700) # 0700 until its owner and mode are set
          made = true
        end
        dir = open_entry(parent, name, :directory)
        settle_dir(dir, ids) if made
      end
      parent.close
    end
    dir
  end

  # A file root may read by name: no symlink on the way but root's own.
  def check_source(path)
    KvmSriovInstall.with_dir(File.dirname(File.expand_path(path))) do |d|
      name = File.basename(path)
      open_entry(d, name, :file).close unless roots_own_link?(d, name)
    end
  end

  def with_dir(path, ids = nil)
    dir = open_path(path, ids)
    yield dir
  ensure
    dir&.close
  end

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

  def settle_dir(dir, ids)
    dir.chown(*ids) if ids && Process.euid.zero?
    dir.chmod(0o755)
  end

  # mkdir -p, where each directory it makes gets the installation's owner and 0755.
  def make_dirs(dir, ids)
    with_dir(dir, ids) { nil }
  end

  # The bytes of a regular file of the checkout (never a symlink's target)
  # and whether it is executable.
  def read_source(src)
    with_dir(File.dirname(File.expand_path(src))) do |d|
      io = open_entry(d, File.basename(src), :file)
      begin
        [io.read, (io.stat.mode & 0o111) != 0]
      ensure
        io.close
      end
    end
  end

  # Write `data` as `name` in the open directory: a new file, renamed over
  # whatever had the name (a symlink there is replaced, not written through).
  def write_into(dir, name, data, mode, ids)
    old = dir.lstat(name)
    raise Refused, "#{File.join(dir.path, name)} is a directory" if old&.directory?
    tmp = ".#{name}.kvm-sriov-#{Process.pid}-#{rand(1 << 32).to_s(16)}"
    begin
      File.open(dir.at(tmp), File::WRONLY | File::CREAT | File::EXCL | File::NOFOLLOW, 0o600) do |f|
        f.binmode
        f.write(data)
        f.chown(*ids) if ids && Process.euid.zero?
        f.chmod(mode)
      end
      File.rename(dir.at(tmp), dir.at(name))
    rescue StandardError
      begin
        File.unlink(dir.at(tmp))
      rescue SystemCallError
        nil
      end
      raise
    end
    File.join(dir.path, name)
  end

  # One file, with explicit mode and the installation's owner.
  def install_file(src, dst_dir, ids, mode: nil)
    data, executable = read_source(src)
    with_dir(dst_dir, ids) do |d|
      write_into(d, File.basename(src), data, mode || (executable ? 0o755 : 0o644), ids)
    end
  end

  def skipped?(name)
    name == '__pycache__' || name.end_with?('.pyc')
  end

  # The checkout's `from` (open) into `to` (open): files and directories
  # only; anything else stops the installation before it is read.
  def copy_dir(from, to, ids)
    settle_dir(to, ids)
    from.children.each do |name|
      next if skipped?(name)
      st = from.lstat(name) or next
      where = File.join(from.path, name)
      raise Refused, "#{where} in the checkout is a symlink: only regular files are installed " \
                     '(replace it with the file itself)' if st.symlink?
      if st.directory?
        sub = open_entry(from, name, :directory)
        begin
          ::Dir.mkdir(to.at(name), 0o700) if to.lstat(name).nil?
          dst = open_entry(to, name, :directory)
          begin
            copy_dir(sub, dst, ids)
          ensure
            dst.close
          end
        ensure
          sub.close
        end
      elsif st.file?
        io = open_entry(from, name, :file)
        begin
          write_into(to, name, io.read, (io.stat.mode & 0o111).zero? ? 0o644 : 0o755, ids)
        ensure
          io.close
        end
      else
        raise Refused, "#{where} in the checkout is not a regular file or directory"
      end
    end
  end

  def copy_tree(src, dst, ids)
    with_dir(src) do |from|
      with_dir(dst, ids) { |to| copy_dir(from, to, ids) }
    end
  end

  # rm -rf of `name` in the open directory, without following a symlink
  # anywhere (a symlink itself is removed, never what it points to).
  def remove_entry(dir, name)
    st = dir.lstat(name) or return
    if st.directory?
      sub = open_entry(dir, name, :directory)
      begin
        sub.children.each { |child| remove_entry(sub, child) }
      ensure
        sub.close
      end
      ::Dir.rmdir(dir.at(name))
    else
      File.unlink(dir.at(name))
    end
  end

  def run(root, remotes)
    ids = owner(remotes)
    drv = File.join(remotes, 'vmm', 'kvm-sriov')
    with_dir(File.join(drv, 'lib'), ids) do |lib|
      settle_dir(lib, ids)
      remove_entry(lib, 'kvm_sriov') # no stale modules from an older version
    end
    copy_tree(File.join(root, 'vmm', 'kvm-sriov'), drv, ids)
    # the one bootstrap every entry point imports first: beside the action scripts
    install_file(File.join(root, 'kvm_sriov_bootstrap.py'), drv, ids, mode: 0o644)
    copy_tree(File.join(root, 'kvm_sriov'), File.join(drv, 'lib', 'kvm_sriov'), ids)
    conf_dir = File.join(remotes, 'etc', 'vmm', 'kvm-sriov')
    with_dir(conf_dir, ids) do |conf|
      settle_dir(conf, ids)
      unless conf.lstat('kvm-sriov.toml')
        data, = read_source(File.join(root, 'etc', 'vmm', 'kvm-sriov', 'kvm-sriov.toml'))
        write_into(conf, 'kvm-sriov.toml', data, 0o644, ids)
      end
    end
    im = File.join(root, 'im')
    copy_tree(im, File.join(remotes, 'im'), ids) if ::Dir.exist?(im) && !::Dir.empty?(im)
    precompile(drv, ids)
  end

  # Every action is a fresh interpreter: bytecode shipped with the remotes
  # saves recompiling the library on each call where it cannot be cached
  # (read-only remotes, PYTHONDONTWRITEBYTECODE). Hash-checked, so the copies
  # `onehost sync` makes stay valid whatever their mtimes. Compiled in a
  # directory only root can enter from a copy of the Python sources just
  # installed, then installed like the rest: compileall itself would follow
  # symlinks.
  def precompile(drv, ids)
    require 'tmpdir'
    ::Dir.mktmpdir('kvm-sriov-compile.') do |tmp|
      stage = File.join(tmp, 'kvm-sriov')
      with_dir(drv) do |from|
        ::Dir.mkdir(stage, 0o700)
        with_dir(stage) { |to| stage_sources(from, to) }
      end
      ok = system(Support::SYSTEM_PYTHON, '-m', 'compileall', '-q', '--invalidation-mode', 'checked-hash',
                  '-s', stage, '-p', drv, stage, out: File::NULL)
      unless ok
        warn "kvm-sriov: could not precompile #{drv}; the scripts still work, each call compiles"
        next
      end
      install_pycache(stage, drv, ids)
    end
  end

  MAX_SOURCE = 1 << 20 # the driver's largest module is about 40 KB

  # The driver's Python sources, from the installed tree (`from`, open) into
  # the stage (`to`, open): regular *.py files of at most MAX_SOURCE bytes,
  # opened without following a symlink. The remotes are oneadmin's: anything
  # else found there (a huge file, a FIFO, a symlink) is passed over unread.
  def stage_sources(from, to)
    from.children.each do |name|
      next if skipped?(name)
      st = from.lstat(name) or next
      if st.directory?
        ::Dir.mkdir(to.at(name), 0o700)
        sub = open_entry(from, name, :directory)
        dst = open_entry(to, name, :directory)
        begin
          stage_sources(sub, dst)
        ensure
          sub.close
          dst.close
        end
      elsif st.file? && name.end_with?('.py') && st.size <= MAX_SOURCE
        io = open_entry(from, name, :file)
        begin
          data = io.read(MAX_SOURCE + 1) || ''
        ensure
          io.close
        end
        write_into(to, name, data, 0o644, nil) if data.bytesize <= MAX_SOURCE
      end
    end
  end

  # The __pycache__ directories compileall made in the staged copy, into the tree.
  def install_pycache(stage, drv, ids)
    ::Dir.glob('**/__pycache__', base: stage).sort.each do |rel|
      with_dir(File.join(stage, rel)) do |from|
        with_dir(File.join(drv, rel), ids) do |to|
          settle_dir(to, ids)
          from.children.each do |name|
            io = open_entry(from, name, :file)
            begin
              write_into(to, name, io.read, 0o644, ids)
            ensure
              io.close
            end
          end
        end
      end
    end
  end
end
