#!/usr/bin/env bash
# A fresh Debian 12 root (debootstrap --variant=minbase once, FRESH_ROOT/base, kept) with an
# overlay per run (thrown away), to prove what a newcomer's machine does:
#   dev-tools/fresh-root.sh NAME...          each suite's or the demo's install step alone
#       (`./dev prereqs:NAME` on this checkout, bind-mounted read-only)
#   dev-tools/fresh-root.sh --machine TASK...  a new user's machine: python3 and git added to
#       the base (what a Debian 12 image has), a fresh clone of this checkout's HEAD with
#       ../shared beside it, then `./dev TASK` for each TASK in order (e.g. demo test), each
#       timed; the kernel's modules and /dev/kvm are the host's, as on any machine
#   (FRESH_ROOT=/work/fresh-root)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
FRESH_ROOT=${FRESH_ROOT:-/work/fresh-root}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
BASE=$FRESH_ROOT/base
ARCHIVES=$FRESH_ROOT/archives      # downloaded .debs, shared by the runs (not by the results)
case "$REPO/" in "$FRESH_ROOT"/*) echo "FRESH_ROOT must be outside the checkout" >&2; exit 2;; esac
mkdir -p "$FRESH_ROOT" "$ARCHIVES/partial"

if [ ! -e "$BASE/.complete" ]; then
  rm -rf "$BASE"
  t=$SECONDS
  debootstrap --variant=minbase bookworm "$BASE" "$MIRROR" > "$FRESH_ROOT/debootstrap.log" 2>&1 \
    || { tail -5 "$FRESH_ROOT/debootstrap.log"; exit 1; }
  # the same suites as this machine's sources (updates and security too)
  cat > "$BASE/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb ${MIRROR%/debian}/debian-security bookworm-security main
EOF
  touch "$BASE/.complete"
  echo "debootstrap: $((SECONDS - t))s"
fi

mount_root() {  # WORKDIR: an overlay root at WORKDIR/root with /proc, /sys, /dev
  local w=$1
  mkdir -p "$w/upper" "$w/work" "$w/root"
  mount -t overlay overlay -o "lowerdir=$BASE,upperdir=$w/upper,workdir=$w/work" "$w/root"
  mkdir -p "$w/root/var/cache/apt/archives"
  mount --bind "$ARCHIVES" "$w/root/var/cache/apt/archives"
  mount -t proc proc "$w/root/proc"
  mount --rbind /sys "$w/root/sys" && mount --make-rslave "$w/root/sys"
  mount --rbind /dev "$w/root/dev" && mount --make-rslave "$w/root/dev"
  mount -t tmpfs tmpfs "$w/root/run"
  cp /etc/resolv.conf "$w/root/etc/resolv.conf"
}

umount_root() {
  local w=$1 p
  for p in /proc/[0-9]*; do  # daemons a run left behind in the root (libvirtd, sshd, QEMU)
    [ "$(readlink "$p/root" 2>/dev/null)" = "$w/root" ] && kill -9 "${p#/proc/}" 2>/dev/null
  done
  umount -R "$w/root" 2>/dev/null || umount -lR "$w/root"
  rm -rf "$w"
}

in_root() {  # WORKDIR LOG COMMAND: run COMMAND (bash) in the root with a clean environment
  chroot "$1/root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 bash -c "$3" > "$2" 2>&1
}

in_machine() {  # WORKDIR LOG COMMAND: as in_root, but the root is the whole machine to what
  # runs there: its own mount namespace pivoted into the root (a chroot is escaped by
  # entering a mount namespace, as the simulated hosts' nsenter does) and its own PID
  # namespace (whatever the run leaves behind ends with it)
  unshare --mount --propagation private --pid --fork -- /bin/sh -c '
    set -e
    r=$1
    mount -t proc proc "$r/proc"
    cd "$r" && mkdir -p .old-root && pivot_root . .old-root
    umount -l /.old-root && rmdir /.old-root
    exec /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      HOME=/root LANG=C.UTF-8 bash -c "$2"' in_machine "$1/root" "$3" > "$2" 2>&1
}

run_one() {  # NAME: 0 when its install step passed and its programs are there
  local name=$1 w rc t
  w=$(mktemp -d "$FRESH_ROOT/run-$name.XXXX")
  mount_root "$w"
  mkdir -p "$w/root$REPO"
  mount --bind "$REPO" "$w/root$REPO" && mount -o remount,bind,ro "$w/root$REPO"
  t=$SECONDS
  set +e
  in_root "$w" "$FRESH_ROOT/$name.log" "cd '$REPO' && ./dev prereqs:$name"
  rc=$?
  set -e
  umount_root "$w"
  tail -1 "$FRESH_ROOT/$name.log"
  printf '%-22s %-4s %5ds  (log: %s)\n' "$name" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
    $((SECONDS - t)) "$FRESH_ROOT/$name.log" | tee -a "$FRESH_ROOT/results"
  return $rc
}

run_machine() {  # TASK...: a new user's machine, the tasks one after the other
  local w rc=0 t task home=/root/work log
  w=$(mktemp -d "$FRESH_ROOT/machine.XXXX")
  MACHINE=$w
  mount_root "$w"
  trap 'umount_root "$MACHINE"' EXIT
  mkdir -p "$w/root$home/shared"
  if [ -d /lib/modules ]; then
    mkdir -p "$w/root/lib/modules" && mount --rbind /lib/modules "$w/root/lib/modules"
  fi
  mount --bind "$REPO/../shared" "$w/root$home/shared" && mount -o remount,bind,ro "$w/root$home/shared"
  cp /etc/hosts /etc/hostname "$w/root/etc/"
  # this network's own trust (a proxy's CA) and pip's settings, as every machine on it has them
  mkdir -p "$w/root/usr/local/share/ca-certificates"
  cp -r /usr/local/share/ca-certificates/. "$w/root/usr/local/share/ca-certificates/" 2>/dev/null || true
  [ -f /etc/pip.conf ] && cp /etc/pip.conf "$w/root/etc/pip.conf"
  in_root "$w" "$FRESH_ROOT/machine-base.log" \
    "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 git ca-certificates && update-ca-certificates" \
    || { tail -5 "$FRESH_ROOT/machine-base.log"; return 1; }
  git clone -q "$REPO" "$w/root$home/main"
  echo "fresh machine: $(git -C "$REPO" rev-parse --short HEAD) cloned into $w/root$home/main"
  for task in "$@"; do
    log=$FRESH_ROOT/machine-$task.log
    t=$SECONDS
    set +e
    in_machine "$w" "$log" "cd $home/main && ./dev $task"
    rc=$?
    set -e
    tail -3 "$log"
    printf 'fresh machine: ./dev %-10s %-4s %5ds  (log: %s)\n' "$task" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
      $((SECONDS - t)) "$log" | tee -a "$FRESH_ROOT/results"
    [ $rc = 0 ] || return $rc
  done
}

if [ "${1:-}" = --machine ]; then
  shift
  run_machine "$@"
  exit $?
fi

failed=0
for name in "$@"; do
  run_one "$name" || failed=1
done
exit $failed
