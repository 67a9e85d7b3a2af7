#!/bin/sh
# Applies kvm_sriov::host and kvm_sriov::frontend for real into a throwaway
# root (fake sysfs with one SR-IOV PF, fake GRUB defaults, fake oned.conf,
# a fake driver source tree), checks the files, then applies again and
# expects no change. `--noop` of the same manifest runs first. Then
# kvm_sriov::subnet_manager's partitions exec, judged by the real opensm, and
# the class without it: the first file only when absent, a hook's file kept.
# Usage: apply_test.sh MODULE_DIR SYSTEM_MODULES_DIR   (run as root)
set -u
MOD=$(cd "$1" && pwd); SYS=$2
ROOT=$(mktemp -d /tmp/kvm-sriov-apply.XXXXXX)
[ -n "${KEEP_ROOT:-}" ] || trap 'rm -rf "$ROOT"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   - $1"; }
bad() { fail=$((fail + 1)); echo "FAIL - $1"; }
check() { desc=$1; shift; if "$@"; then ok "$desc"; else bad "$desc"; fi; }

mkdir -p "$ROOT/modules" "$ROOT/etc/default" "$ROOT/etc/one" "$ROOT/run" "$ROOT/src"
ln -s "$MOD" "$ROOT/modules/kvm_sriov"
ln -s "$SYS/stdlib" "$ROOT/modules/stdlib"
ln -s "$SYS/augeas_core" "$ROOT/modules/augeas_core"
PF=$ROOT/sys/bus/pci/devices/0000:03:00.0
mkdir -p "$PF" "$ROOT/sys/module/vfio" "$ROOT/sys/module/vfio_iommu_type1" "$ROOT/sys/module/vfio_pci"
echo 16 > "$PF/sriov_totalvfs"; echo 0 > "$PF/sriov_numvfs"; echo 1 > "$PF/sriov_drivers_autoprobe"
cat > "$ROOT/etc/default/grub" <<'G'
GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`
GRUB_CMDLINE_LINUX_DEFAULT="quiet"
GRUB_CMDLINE_LINUX="console=ttyS0 intel_iommu=off"
G
# Debian's fstab has no /dev/shm line (systemd mounts it); one site line to keep.
printf 'UUID=0a1b / ext4 errors=remount-ro 0 1\n' > "$ROOT/etc/fstab"
printf 'LOG = [ SYSTEM = "file" ]\nVM_MAD = [\n    NAME = "kvm",\n    EXECUTABLE = "one_vmm_exec" ]\n' > "$ROOT/etc/one/oned.conf"
# OpenNebula 7.4's stock SCHED_MAD, with the comment line its oned.conf has above it.
printf '#    * arguments: for the scheduler driver\nSCHED_MAD = [\n      EXECUTABLE = "one_sched",\n      ARGUMENTS  = "-t 15 -p rank -o one_drs"\n]\n' >> "$ROOT/etc/one/oned.conf"
STOCK_SCHED='      ARGUMENTS  = "-t 15 -p rank -o one_drs"'
# the stock defaults file the registration makes vmm_exec_kvm-sriov.conf from (a stand-in)
mkdir -p "$ROOT/etc/one/vmm_exec"
printf 'OS = [ ARCH = "x86_64" ]\nFEATURES = [ ACPI = "yes" ]\n' > "$ROOT/etc/one/vmm_exec/vmm_exec_kvm.conf"
REPO=$(cd "$MOD/../.." && pwd)
# The driver's source layout (docs/conventions.md), minimal.
mkdir -p "$ROOT/src/vmm/kvm-sriov" "$ROOT/src/kvm_sriov/__pycache__" "$ROOT/src/im/kvm-probes.d/host/monitor" \
  "$ROOT/src/im/kvm-probes.d/vm/monitor" \
  "$ROOT/src/etc/vmm/kvm-sriov" "$ROOT/src/templates"
printf '#!/bin/sh\n' > "$ROOT/src/vmm/kvm-sriov/deploy"; chmod 755 "$ROOT/src/vmm/kvm-sriov/deploy"
# the real library and templates/oned: the front-end's registration (kvm-sriov
# setup-frontend) runs from the library installed into the remotes
cp -R "$REPO/kvm_sriov/." "$ROOT/src/kvm_sriov/"; rm -rf "$ROOT/src/kvm_sriov/__pycache__"
cp "$REPO/kvm_sriov_bootstrap.py" "$ROOT/src/"
mkdir -p "$ROOT/src/kvm_sriov/__pycache__"; echo x > "$ROOT/src/kvm_sriov/__pycache__/x.pyc"
printf '#!/usr/bin/python3\n' > "$ROOT/src/im/kvm-probes.d/host/monitor/kvm_sriov.py"
printf '#!/usr/bin/python3\n' > "$ROOT/src/im/kvm-probes.d/vm/monitor/kvm_sriov_vf.py"
printf '[pool]\npfs = []\n' > "$ROOT/src/etc/vmm/kvm-sriov/kvm-sriov.toml"
printf 'NAME = "ib-sriov"\n' > "$ROOT/src/templates/vnet.tmpl"
cp -R "$REPO/templates/oned" "$ROOT/src/templates/oned"
mkdir -p "$ROOT/src/sched/kvm-sriov"
printf '#!/bin/sh\n' > "$ROOT/src/sched/kvm-sriov/place"; chmod 755 "$ROOT/src/sched/kvm-sriov/place"

cat > "$ROOT/site.pp" <<P
class { 'kvm_sriov::host':
  augeas_root          => '$ROOT',
  iommu_vendor         => 'intel',
  grub_update_command  => 'touch $ROOT/grub-updated',
  reboot_required_file => '$ROOT/run/reboot-required',
  sysfs_root           => '$ROOT/sys',
  helper_dir           => '$ROOT/usr/local/sbin',
  vfs_config_dir       => '$ROOT/etc/kvm-sriov/vfs.d',
  systemd_dir          => '$ROOT/etc/systemd/system',
  modprobe_dir         => '$ROOT/etc/modprobe.d',
  modules_load_dir     => '$ROOT/etc/modules-load.d',
  udev_rules_dir       => '$ROOT/etc/udev/rules.d',
  config_file          => '$ROOT/etc/kvm-sriov/kvm-sriov.toml',
  manage_libvirt       => false,
  pool_pfs             => ['0000:03:00.0'],
  numa_policy          => 'require',
  state_dir            => '$ROOT/var/lib/one/kvm-sriov',
  pfs                  => { '0000:03:00.0' => { 'numvfs' => 8, 'drivers_autoprobe' => false } },
  remotes_source       => '$ROOT/src',
  remotes_dir          => '$ROOT/var/tmp/one',
  remotes_owner        => 'root',
  remotes_group        => 'root',
  shm_size             => '8G',
  fstab_file           => '$ROOT/etc/fstab',
  shm_remount_command  => 'touch $ROOT/shm-remounted',
}
class { 'kvm_sriov::frontend':
  source        => '$ROOT/src',
  remotes_dir   => '$ROOT/var/lib/one/remotes',
  owner         => 'root',
  group         => 'root',
  oned_conf     => '$ROOT/etc/one/oned.conf',
  snippet_file  => '$ROOT/etc/one/kvm-sriov-vm_mad.conf',
  templates_dir => '$ROOT/usr/share/kvm-sriov/templates',
  manage_hooks  => false,  # no oned here: tests/packaging/test_ansible.py registers them with a stand-in
}
P
for d in etc/modprobe.d etc/modules-load.d etc/udev/rules.d etc/systemd/system/multi-user.target.wants usr/local/sbin usr/share var/lib/one; do
  mkdir -p "$ROOT/$d"
done

apply() { # extra puppet args...; prints the exit code (--detailed-exitcodes)
  puppet apply --modulepath "$ROOT/modules" --detailed-exitcodes --color=false \
    --vardir "$ROOT/puppet-var" --logdir "$ROOT/puppet-log" "$@" "$ROOT/site.pp" 2>&1 \
    | grep -v 'Facter: Permission denied' >> "$ROOT/apply.log"
}
runapply() { apply "$@"; } # keep the exit code of puppet, not grep
run() { : > "$ROOT/apply.log"
  puppet apply --modulepath "$ROOT/modules" --detailed-exitcodes --color=false \
    --vardir "$ROOT/puppet-var" --logdir "$ROOT/puppet-log" "$@" "$ROOT/site.pp" > "$ROOT/apply.log" 2>&1
  rc=$?; grep -v 'Facter: Permission denied' "$ROOT/apply.log"; return $rc; }

run --noop; rc=$?
check "noop apply compiles and evaluates (exit $rc)" [ "$rc" = 0 -o "$rc" = 2 ]
check "noop changed nothing" [ "$(cat "$PF/sriov_numvfs")" = 0 ]

run; rc=$?
check "apply succeeds with changes (exit $rc)" [ "$rc" = 2 ]
check "GRUB has the IOMMU arguments, others kept" grep -qx 'GRUB_CMDLINE_LINUX="console=ttyS0 intel_iommu=on iommu=pt"' "$ROOT/etc/default/grub"
check "GRUB_CMDLINE_LINUX_DEFAULT untouched" grep -qx 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"' "$ROOT/etc/default/grub"
check "boot loader config regenerated" [ -e "$ROOT/grub-updated" ]
check "reboot flagged" [ -e "$ROOT/run/reboot-required" ]
check "reboot notice logged" grep -q 'reboot to enable the IOMMU' "$ROOT/apply.log"
check "sriov_numvfs is 8" [ "$(cat "$PF/sriov_numvfs")" = 8 ]
check "sriov_drivers_autoprobe is 0" [ "$(cat "$PF/sriov_drivers_autoprobe")" = 0 ]
check "boot file for the PF" grep -qx 'NUMVFS=8' "$ROOT/etc/kvm-sriov/vfs.d/0000_03_00.0.conf"
check "boot unit enabled" [ -L "$ROOT/etc/systemd/system/multi-user.target.wants/kvm-sriov-vfs.service" ]
check "helper installed executable" [ -x "$ROOT/usr/local/sbin/kvm-sriov-vfs" ]
check "vfio modules-load file" grep -qx vfio_pci "$ROOT/etc/modules-load.d/kvm-sriov.conf"
check "host config has the pool keys" grep -qx 'numa_policy = "require"' "$ROOT/etc/kvm-sriov/kvm-sriov.toml"
check "host config has the PF list" grep -qx 'pfs = \["0000:03:00.0"\]' "$ROOT/etc/kvm-sriov/kvm-sriov.toml"
if command -v python3 >/dev/null && python3 -c 'import tomllib' 2>/dev/null; then
  check "host config parses as TOML" python3 -c 'import sys, tomllib; tomllib.load(open(sys.argv[1], "rb"))' "$ROOT/etc/kvm-sriov/kvm-sriov.toml"
fi
check "fstab has the /dev/shm size" grep -qx 'tmpfs /dev/shm tmpfs defaults,nosuid,nodev,size=8G 0 0' "$ROOT/etc/fstab"
check "fstab keeps the site's lines" grep -qx 'UUID=0a1b / ext4 errors=remount-ro 0 1' "$ROOT/etc/fstab"
check "/dev/shm remounted with the size" [ -e "$ROOT/shm-remounted" ]
check "state dir created" [ -d "$ROOT/var/lib/one/kvm-sriov" ]
check "host remotes: action" [ -x "$ROOT/var/tmp/one/vmm/kvm-sriov/deploy" ]
check "host remotes: library" [ -f "$ROOT/var/tmp/one/vmm/kvm-sriov/lib/kvm_sriov/__init__.py" ]
check "host remotes: no __pycache__" [ ! -e "$ROOT/var/tmp/one/vmm/kvm-sriov/lib/kvm_sriov/__pycache__" ]
check "host remotes: probe" [ -f "$ROOT/var/tmp/one/im/kvm-probes.d/host/monitor/kvm_sriov.py" ]
check "host remotes: VM probe" [ -f "$ROOT/var/tmp/one/im/kvm-probes.d/vm/monitor/kvm_sriov_vf.py" ]
check "front-end remotes: cluster config" [ -f "$ROOT/var/lib/one/remotes/etc/vmm/kvm-sriov/kvm-sriov.toml" ]
check "front-end templates" [ -f "$ROOT/usr/share/kvm-sriov/templates/vnet.tmpl" ]
check "front-end placement policy" [ -x "$ROOT/var/lib/one/remotes/scheduler/kvm-sriov/place" ]
check "oned.conf has the VM_MAD" grep -q 'ARGUMENTS      = "-t 15 -r 0 kvm-sriov -p"' "$ROOT/etc/one/oned.conf"
check "oned.conf keeps the kvm VM_MAD" grep -q 'NAME = "kvm",' "$ROOT/etc/one/oned.conf"
check "the VM_MAD between setup-frontend's markers" \
  grep -qF "# BEGIN kvm-sriov (written by \`kvm-sriov setup-frontend\`" "$ROOT/etc/one/oned.conf"
check "its DEFAULT is the file the registration writes" \
  grep -q 'DEFAULT        = "vmm_exec/vmm_exec_kvm-sriov.conf"' "$ROOT/etc/one/oned.conf"
check "the defaults file written" grep -q 'host-passthrough' "$ROOT/etc/one/vmm_exec/vmm_exec_kvm-sriov.conf"
check "oned restart notice logged" grep -q 'restart oned' "$ROOT/apply.log"
check "SCHED_MAD left as it was (manage_sched_mad defaults to false)" grep -qxF "$STOCK_SCHED" "$ROOT/etc/one/oned.conf"

rm -f "$ROOT/grub-updated" "$ROOT/shm-remounted"
run; rc=$?
check "second apply changes nothing (exit $rc)" [ "$rc" = 0 ]
check "second apply did not regenerate GRUB" [ ! -e "$ROOT/grub-updated" ]
check "second apply did not remount /dev/shm" [ ! -e "$ROOT/shm-remounted" ]
check "one /dev/shm line in fstab" [ "$(grep -c '/dev/shm' "$ROOT/etc/fstab")" = 1 ]
check "VM_MAD present once" [ "$(grep -c 'NAME           = "kvm-sriov"' "$ROOT/etc/one/oned.conf")" = 1 ]

# manage_sched_mad: the kvm-sriov placer selected, and the way back.
sed -i "s|^  templates_dir => |  manage_sched_mad => true,\n  templates_dir => |" "$ROOT/site.pp"
cp "$ROOT/etc/one/oned.conf" "$ROOT/oned.conf.before"
run; rc=$?
check "placer apply succeeds with changes (exit $rc)" [ "$rc" = 2 ]
check "SCHED_MAD selects the kvm-sriov placer" grep -qxF '      ARGUMENTS  = "-t 15 -p kvm-sriov -o one_drs"' "$ROOT/etc/one/oned.conf"
check "only that line changed, and the block's note of the placer before" \
  [ "$(diff "$ROOT/oned.conf.before" "$ROOT/etc/one/oned.conf" | grep -c '^[<>]')" = 3 ]
check "restart notice for the placer" grep -q 'SCHED_MAD placer.*restart oned' "$ROOT/apply.log"
run; rc=$?
check "second placer apply changes nothing (exit $rc)" [ "$rc" = 0 ]
sed -i '/^  manage_sched_mad => true,$/d' "$ROOT/site.pp"
run; rc=$?
check "the way back applies with changes (exit $rc)" [ "$rc" = 2 ]
check "the way back restores oned.conf as it was" cmp -s "$ROOT/oned.conf.before" "$ROOT/etc/one/oned.conf"
run; rc=$?
check "then nothing changes (exit $rc)" [ "$rc" = 0 ]
sed -i "s|-p rank -o|-p custom -o|" "$ROOT/etc/one/oned.conf"
run; rc=$?
check "another placer chosen by hand is left alone (exit $rc)" [ "$rc" = 0 ] && grep -q -- '-p custom -o' "$ROOT/etc/one/oned.conf"
sed -i "s|-p custom -o|-p rank -o|" "$ROOT/etc/one/oned.conf"
printf 'VM_MAD = [ NAME = "kvm" ]\n' > "$ROOT/no-sched.conf"
refuses() { ! "$@" 2>/dev/null; }
check "the registration refuses an oned.conf without SCHED_MAD" \
  refuses env PYTHONPATH="$ROOT/var/lib/one/remotes/vmm/kvm-sriov/lib" python3 -m kvm_sriov.frontend.oned_conf setup \
  --oned-conf "$ROOT/no-sched.conf" --templates "$ROOT/usr/share/kvm-sriov/templates"
check "and leaves it unchanged" [ "$(cat "$ROOT/no-sched.conf")" = 'VM_MAD = [ NAME = "kvm" ]' ]

# kvm_sriov::subnet_manager: the partitions exec end to end, with the driver's
# CLI from this checkout and the real opensm judging each candidate file.
SM=$ROOT/etc/opensm
mkdir -p "$SM"
cp "$REPO/tests/ib/golden/vnpool.xml" "$ROOT/vnpool.xml"
cat > "$ROOT/kvm-sriov" <<S
#!/bin/sh
exec $REPO/bin/kvm-sriov "\$@"
S
# What the old CLI printed on stdout: a summary line instead of the file.
mkdir -p "$ROOT/old"
cat > "$ROOT/old/kvm-sriov" <<S
#!/bin/sh
case " \$* " in *" --validate "*) exec $REPO/bin/kvm-sriov "\$@";; esac
echo "$SM/partitions.conf: 2 network(s), 7 port GUID(s), unchanged"
S
# A wrapper (ssh to the front-end, say) that ignores --validate and prints a
# file opensm cannot parse.
cat > "$ROOT/partitions-over-ssh" <<S
#!/bin/sh
echo "net=0x8001, ipoib : nonsense ;"
S
chmod 755 "$ROOT/kvm-sriov" "$ROOT/old/kvm-sriov" "$ROOT/partitions-over-ssh"
sm_site() { # partitions command [validate command]
  cat > "$ROOT/site.pp" <<P
class { 'kvm_sriov::subnet_manager':
  manage_service     => false,
  config_file        => '$SM/opensm.conf',
  partitions_file    => '$SM/partitions.conf',
  defaults_file      => '$ROOT/etc/default/opensm',
  partitions_command => '$1',
  validate_command   => ${2:-undef},
  reload_command     => 'touch $ROOT/opensm-reloaded',
}
P
}
sm_site "$ROOT/kvm-sriov partitions --from-xml $ROOT/vnpool.xml"
"$ROOT/kvm-sriov" partitions --from-xml "$ROOT/vnpool.xml" > "$ROOT/expected.conf"
run; rc=$?
check "SM apply succeeds with changes (exit $rc)" [ "$rc" = 2 ]
check "partitions.conf is what the CLI prints" cmp -s "$ROOT/expected.conf" "$SM/partitions.conf"
check "partitions.conf has the networks' partitions" grep -q '^one_vnet_3=0x8001, ipoib, defmember=full :$' "$SM/partitions.conf"
check "opensm told to reload" [ -e "$ROOT/opensm-reloaded" ]
check "no candidate file left" [ ! -e "$SM/partitions.conf.new" ]
check "the real opensm accepts the file in place" "$ROOT/kvm-sriov" partitions --validate "$SM/partitions.conf"
rm -f "$ROOT/opensm-reloaded"
run; rc=$?
check "second SM apply changes nothing (exit $rc)" [ "$rc" = 0 ]
check "no needless reload" [ ! -e "$ROOT/opensm-reloaded" ]
sm_site "$ROOT/old/kvm-sriov partitions --from-xml $ROOT/vnpool.xml"
run; rc=$?
check "a generator printing a summary line fails the apply (exit $rc)" [ "$rc" = 4 -o "$rc" = 6 ]
check "opensm's verdict is in the log" grep -q 'PARSE ERROR' "$ROOT/apply.log"
check "partitions.conf kept the last good file" cmp -s "$ROOT/expected.conf" "$SM/partitions.conf"
check "the rejected candidate is gone" [ ! -e "$SM/partitions.conf.new" ]
check "no reload after a rejected file" [ ! -e "$ROOT/opensm-reloaded" ]
sm_site "$ROOT/partitions-over-ssh"
run; rc=$?
check "a wrapper without validate_command is refused (exit $rc)" [ "$rc" = 1 ]
check "the refusal says to set validate_command" grep -q 'is not the local kvm-sriov CLI.*set validate_command' "$ROOT/apply.log"
check "partitions.conf untouched by it" cmp -s "$ROOT/expected.conf" "$SM/partitions.conf"
sm_site "$ROOT/partitions-over-ssh" "'$ROOT/kvm-sriov partitions --validate'"
run; rc=$?
check "with its own validator, opensm rejects the wrapper's file (exit $rc)" [ "$rc" = 4 -o "$rc" = 6 ]
check "partitions.conf still the last good file" cmp -s "$ROOT/expected.conf" "$SM/partitions.conf"
check "no reload after the wrapper's file" [ ! -e "$ROOT/opensm-reloaded" ]

# kvm_sriov::subnet_manager without partitions_command: the file is the network
# hook's; Puppet creates it only when absent and never touches it again.
sm_plain() { # [more parameters]
  cat > "$ROOT/site.pp" <<P
class { 'kvm_sriov::subnet_manager':
  manage_service  => false,
  config_file     => '$SM/opensm.conf',
  partitions_file => '$SM/partitions.conf',
  defaults_file   => '$ROOT/etc/default/opensm',
  reload_command  => 'touch $ROOT/opensm-reloaded',
  ${1:-}
}
P
}
rm -f "$SM/partitions.conf" "$ROOT/opensm-reloaded"
sm_plain
run; rc=$?
check "first SM apply without a command creates the partitions file (exit $rc)" [ "$rc" = 2 ]
check "it holds the driver's Default line only" \
  [ "$(grep -v '^#' "$SM/partitions.conf")" = 'Default=0x7fff, ipoib : SELF=full, ALL_SWITCHES=full ;' ]
check "root's, 0644" [ "$(stat -c %U:%a "$SM/partitions.conf")" = root:644 ]
check "the real opensm accepts it" "$ROOT/kvm-sriov" partitions --validate "$SM/partitions.conf"
check "opensm told to reload for the new file" [ -e "$ROOT/opensm-reloaded" ]
rm -f "$ROOT/opensm-reloaded"
# What the front-end's network hook installs on the SM node (its own mode after).
"$ROOT/kvm-sriov" partitions --from-xml "$ROOT/vnpool.xml" \
  | "$ROOT/kvm-sriov" partitions --install - --output "$SM/partitions.conf" 2>/dev/null
chmod 0640 "$SM/partitions.conf"
cp -p "$SM/partitions.conf" "$ROOT/hook.conf"
check "the hook wrote the networks' partitions" grep -q '^one_vnet_3=0x8001' "$SM/partitions.conf"
run; rc=$?
check "a later SM apply changes nothing (exit $rc)" [ "$rc" = 0 ]
check "the hook's file kept byte for byte" cmp -s "$ROOT/hook.conf" "$SM/partitions.conf"
check "and its mode" [ "$(stat -c %a "$SM/partitions.conf")" = 640 ]
check "no reload for it" [ ! -e "$ROOT/opensm-reloaded" ]
rm -f "$SM/partitions.conf"
sm_plain 'create_partitions_file => false,'
run; rc=$?
check "opted out (create_partitions_file false): apply succeeds (exit $rc)" [ "$rc" = 0 -o "$rc" = 2 ]
check "opted out: no partitions file made" [ ! -e "$SM/partitions.conf" ]
check "opted out: no reload" [ ! -e "$ROOT/opensm-reloaded" ]

echo "apply: $pass passed, $fail failed"
[ "$fail" = 0 ]
