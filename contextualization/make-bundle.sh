#!/usr/bin/env bash
# Build one self-extracting file with every guest script, for OpenNebula
# context delivery: register it in a Files datastore and reference it with
#   CONTEXT = [ FILES_DS = "$FILE[IMAGE=\"kvm-sriov-ib-context.sh\"]",
#               INIT_SCRIPTS = "kvm-sriov-ib-context.sh", ... ]
# When run it installs the hooks into /etc/one-context.d and runs them once.
#   make-bundle.sh OUTPUT
set -eu
out=${1:?usage: make-bundle.sh OUTPUT}
src=$(dirname "$(readlink -f "$0")")
payload=$(tar -C "$src" -czf - install.sh loc-16-kvm-sriov-ib net-16-kvm-sriov-ib \
    net-90-kvm-sriov-sm kvm-sriov-ib.d/functions.sh kvm-sriov-ib.d/kvm-sriov-ib-hotplug \
    udev/90-kvm-sriov-ib.rules sm/kvm-sriov-opensm \
    sm/kvm-sriov-opensm.default ivshmem/loc-17-kvm-sriov-ivshmem ivshmem/kvm-sriov-ivshmem \
    hostfile/net-95-kvm-sriov-hostfile hostfile/kvm-sriov-hostfile | base64 -w 76)
mkdir -p "$(dirname "$out")"
{
    cat <<'HEAD'
#!/usr/bin/env bash
# kvm-sriov guest scripts (self-extracting). Installs the InfiniBand one-context
# hooks into /etc/one-context.d and runs them once. Arguments go to install.sh.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed '1,/^__PAYLOAD__$/d' "$0" | base64 -d | tar -C "$tmp" -xzf -
if [ $# -eq 0 ]; then set -- --run; fi
"$tmp/install.sh" "$@"
exit 0
__PAYLOAD__
HEAD
    printf '%s\n' "$payload"
} >"$out"
chmod 0755 "$out"
echo "wrote $out"
