"""OpenNebula's own kvm driver on a simulated host, from OpenNebula's source
tarball, laid out in the remotes as its install.sh and `onehost sync` leave
it (kvm-sriov runs these scripts for the hypervisor work of every action).

The tarball is ../shared/opennebula/opennebula-7.4.0.tar.gz beside the
checkout, or wherever ONE_SOURCE_TARBALL points.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARBALL_VAR = "ONE_SOURCE_TARBALL"
DEFAULT_TARBALL = REPO.parent / "shared" / "opennebula" / "opennebula-7.4.0.tar.gz"

# tarball path (under opennebula-<v>/) -> path in the remotes
_FILES = {
    "src/vmm_mad/remotes/kvm/kvmrc": "etc/vmm/kvm/kvmrc",
    "src/vmm_mad/remotes/lib/kvm/opennebula_vm.rb": "vmm/kvm/opennebula_vm.rb",
    "src/vmm_mad/remotes/lib/command.rb": "vmm/lib/command.rb",
    "src/vmm_mad/remotes/lib/xmlparser.rb": "vmm/lib/xmlparser.rb",
    "src/vmm_mad/remotes/lib/opennebula_vm.rb": "vmm/lib/opennebula_vm.rb",
    "src/vmm_mad/remotes/kvm/vgpu": "vgpu",
    "src/vmm_mad/remotes/kvm/vtpm_setup": "vtpm_setup",
    "src/mad/sh/scripts_common.sh": "scripts_common.sh",
    "src/mad/ruby/DriverLogger.rb": "DriverLogger.rb",
    "src/mad/ruby/CommandManager.rb": "CommandManager.rb",
    "src/datastore_mad/remotes/xpath.rb": "datastore/xpath.rb",
    "src/im_mad/remotes/lib/kvm_qemu_ga.rb": "im/lib/kvm_qemu_ga.rb",
}
# what a node's OpenNebula packages put on ruby's load path
_RUBY_LIB = {"share/misc/load_opennebula_paths.rb": "load_opennebula_paths.rb"}


def tarball() -> Path:
    path = Path(os.environ.get(TARBALL_VAR) or DEFAULT_TARBALL)
    if not path.is_file():
        raise FileNotFoundError(f"OpenNebula's source tarball is not at {path}: set {TARBALL_VAR} "
                                f"to an opennebula-7.4.x.tar.gz (its kvm driver scripts are needed)")
    return path


def _members(tar: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    return {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name and m.isfile()}


def kvm_actions(source: Path | None = None) -> list[str]:
    """The actions of the stock kvm driver: the scripts install.sh puts in
    remotes/vmm/kvm, without hooks and helpers (names with a dot)."""
    with tarfile.open(source or tarball()) as tar:
        text = tar.extractfile(_members(tar)["install.sh"]).read().decode()
    listed = re.search(r'^VMM_EXEC_KVM_SCRIPTS="([^"]*)"', text, re.M).group(1).split()
    return sorted(Path(p).name for p in listed if p != "\\" and "." not in Path(p).name)


def ruby_lib(remotes: Path) -> Path:
    return Path(remotes).parent / "one-ruby"


def install(remotes: Path, source: Path | None = None) -> Path:
    """Install the stock kvm driver into remotes; returns the directory to
    put on RUBYLIB (a node's packages make load_opennebula_paths loadable)."""
    lib = ruby_lib(remotes)
    with tarfile.open(source or tarball()) as tar:
        members = _members(tar)
        wanted = {name: f"vmm/kvm/{Path(name).name}" for name in members
                  if name.startswith("src/vmm_mad/remotes/kvm/")}
        wanted.update(_FILES)
        for name, dest in [*wanted.items(), *((n, str(lib / d)) for n, d in _RUBY_LIB.items())]:
            member = members[name]
            target = Path(remotes) / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
            executable = member.mode & stat.S_IXUSR
            target.chmod(0o755 if executable else 0o644)
    _use_node_gems(lib / "load_opennebula_paths.rb", remotes)
    return lib


def _use_node_gems(paths_rb: Path, remotes: Path) -> None:
    """load_opennebula_paths.rb makes GEMS_LOCATION Ruby's only gem folder (it fails
    when there is none, and hides rexml when it is empty), and the stock scripts
    (datastore/xpath.rb) and that file default it to NODE_GEMS_DIR with ||=. Defined
    first (environment()'s RUBYOPT), this simulated node's node_gems() is the one
    they all keep: nothing outside the remotes is needed or touched. Without Ruby
    no stock Ruby script can run: left as it is."""
    if shutil.which("ruby") is None:
        return
    (paths_rb.parent / NODE_GEMS_RB).write_text(f"GEMS_LOCATION = '{node_gems(remotes)}'\n")


# what the stock scripts' Ruby (opennebula_vm.rb, xmlparser.rb, datastore/xpath.rb)
# loads beyond Ruby's own library: a bundled gem, outside the one gem folder
# load_opennebula_paths.rb leaves Ruby
NODE_GEMS = ("rexml",)
# where a node's OpenNebula packages keep their gems (load_opennebula_paths.rb's default)
NODE_GEMS_DIR = "/usr/share/one/gems"
NODE_GEMS_RB = "node_gems_location.rb"   # next to load_opennebula_paths.rb


def node_gems(remotes: Path) -> Path:
    """A gem folder like a node's NODE_GEMS_DIR, holding (as links) Debian's
    copies of NODE_GEMS, next to the remotes."""
    home = Path(remotes).parent / "one-gems"
    script = ('require "fileutils"; home = ARGV.shift\n'
              '%w[specifications gems].each { |d| FileUtils.mkdir_p(File.join(home, d)) }\n'
              'ARGV.each do |n|\n'
              '  s = Gem::Specification.find_by_name(n)\n'
              '  next if s.default_gem?\n'
              '  { s.loaded_from => File.join(home, "specifications", File.basename(s.loaded_from)),\n'
              '    s.full_gem_path => File.join(home, "gems", s.full_name) }.each do |from, to|\n'
              '    File.symlink(from, to) unless File.symlink?(to)\n'
              '  end\n'
              'end\n')
    subprocess.run(["ruby", "-e", script, str(home), *NODE_GEMS], check=True, capture_output=True)
    return home


def environment(lib: Path) -> dict[str, str]:
    """What a node's environment has for the stock ruby scripts."""
    preload = Path(lib) / NODE_GEMS_RB
    return {"RUBYLIB": str(lib), **({"RUBYOPT": f"-r{preload}"} if preload.is_file() else {})}
