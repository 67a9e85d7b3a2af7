#!/usr/bin/env bash
# Each named install step (a suite's `rake prereqs:<name>`, or the demo's) alone in a
# fresh Debian 12 root: debootstrap --variant=minbase once (FRESH_ROOT/base, kept),
# then per name an overlay on it (thrown away), this checkout bind-mounted read-only,
# and `./dev prereqs:<name>` run there as a newcomer would: ./dev installs rake, the
# step installs the declared packages and checks every program the code starts.
#   dev-tools/fresh-root.sh NAME...      (FRESH_ROOT=/work/fresh-root)
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

run_one() {  # NAME: 0 when its install step passed and its programs are there
  local name=$1 w rc t
  w=$(mktemp -d "$FRESH_ROOT/run-$name.XXXX")
  mkdir -p "$w/upper" "$w/work" "$w/root"
  mount -t overlay overlay -o "lowerdir=$BASE,upperdir=$w/upper,workdir=$w/work" "$w/root"
  mkdir -p "$w/root$REPO" "$w/root/var/cache/apt/archives"
  mount --bind "$REPO" "$w/root$REPO" && mount -o remount,bind,ro "$w/root$REPO"
  mount --bind "$ARCHIVES" "$w/root/var/cache/apt/archives"
  mount -t proc proc "$w/root/proc"
  mount --rbind /sys "$w/root/sys" && mount --make-rslave "$w/root/sys"
  mount --rbind /dev "$w/root/dev" && mount --make-rslave "$w/root/dev"
  cp /etc/resolv.conf "$w/root/etc/resolv.conf"
  t=$SECONDS
  set +e
  chroot "$w/root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 bash -c "cd '$REPO' && ./dev prereqs:$name" > "$FRESH_ROOT/$name.log" 2>&1
  rc=$?
  set -e
  umount -R "$w/root" 2>/dev/null || umount -lR "$w/root"
  rm -rf "$w"
  tail -1 "$FRESH_ROOT/$name.log"
  printf '%-22s %-4s %5ds  (log: %s)\n' "$name" "$([ $rc = 0 ] && echo ok || echo FAIL)" \
    $((SECONDS - t)) "$FRESH_ROOT/$name.log" | tee -a "$FRESH_ROOT/results"
  return $rc
}

failed=0
for name in "$@"; do
  run_one "$name" || failed=1
done
exit $failed
