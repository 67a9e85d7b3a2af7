#!/usr/bin/env bash
# Install the kvm-sriov guest scripts into an image or a running VM.
#   install.sh [--root DIR] [--sm-host] [--hostfile] [--run]
#     --root DIR  install below DIR (an image mounted at DIR), default /
#     --sm-host   also install kvm-sriov-opensm in /usr/local/sbin (a host or
#                 VM that runs the subnet manager outside one-context)
#     --hostfile  also install the MPI hostfile hook (done anyway when the
#                 context being applied names IB_HOSTFILE)
#     --run       run the hooks now (first boot through INIT_SCRIPTS, when
#                 one-contextd's local stage has already passed)
# Re-running is harmless: files are only rewritten when they differ.
set -eu
src=$(dirname "$(readlink -f "$0")")
root=/ sm_host=no run=no hostfile=no
[ -n "${IB_HOSTFILE:-}" ] && hostfile=yes
while [ $# -gt 0 ]; do
    case "$1" in
        --root) root=$2; shift ;;
        --sm-host) sm_host=yes ;;
        --hostfile) hostfile=yes ;;
        --run) run=yes ;;
        *) echo "usage: $0 [--root DIR] [--sm-host] [--hostfile] [--run]" >&2; exit 2 ;;
    esac
    shift
done
ctx="${root%/}/etc/one-context.d"

put() { # put MODE SRC DEST
    mkdir -p "$(dirname "$3")"
    if ! cmp -s "$2" "$3"; then
        install -m "$1" "$2" "$3"
        echo "kvm-sriov-ib: installed $3"
    fi
}

for f in loc-16-kvm-sriov-ib net-16-kvm-sriov-ib net-90-kvm-sriov-sm; do
    put 0755 "$src/$f" "$ctx/$f"
done
put 0644 "$src/kvm-sriov-ib.d/functions.sh" "$ctx/kvm-sriov-ib.d/functions.sh"
# the guest's own IB outage across a VF hot-unplug and plug (a live migration):
# udev runs the handler on every InfiniBand device's removal and arrival
put 0755 "$src/kvm-sriov-ib.d/kvm-sriov-ib-hotplug" "$ctx/kvm-sriov-ib.d/kvm-sriov-ib-hotplug"
rules="${root%/}/etc/udev/rules.d/90-kvm-sriov-ib.rules"
if ! cmp -s "$src/udev/90-kvm-sriov-ib.rules" "$rules"; then
    put 0644 "$src/udev/90-kvm-sriov-ib.rules" "$rules"
    if [ "$root" = / ] && command -v udevadm >/dev/null 2>&1; then
        udevadm control --reload >/dev/null 2>&1 || true
    fi
fi
put 0755 "$src/sm/kvm-sriov-opensm" "$ctx/kvm-sriov-ib.d/kvm-sriov-opensm"
# shared memory between co-resident VMs (docs/ivshmem.md): the hook finds its tool there
put 0755 "$src/ivshmem/loc-17-kvm-sriov-ivshmem" "$ctx/loc-17-kvm-sriov-ivshmem"
put 0755 "$src/ivshmem/kvm-sriov-ivshmem" "$ctx/kvm-sriov-ivshmem.d/kvm-sriov-ivshmem"
# the MPI hostfile of a OneFlow service, from OneGate (docs/mpi-cluster.md); the
# hook only where asked for, so other VMs' one-context runs nothing more
put 0755 "$src/hostfile/kvm-sriov-hostfile" "$ctx/kvm-sriov-hostfile.d/kvm-sriov-hostfile"
if [ $hostfile = yes ]; then
    put 0755 "$src/hostfile/net-95-kvm-sriov-hostfile" "$ctx/net-95-kvm-sriov-hostfile"
fi
if [ $sm_host = yes ]; then
    put 0755 "$src/sm/kvm-sriov-opensm" "${root%/}/usr/local/sbin/kvm-sriov-opensm"
    [ -e "${root%/}/etc/default/kvm-sriov-opensm" ] ||
        put 0644 "$src/sm/kvm-sriov-opensm.default" "${root%/}/etc/default/kvm-sriov-opensm"
fi

if [ $run = yes ]; then
    "$ctx/loc-16-kvm-sriov-ib" local || true
    "$ctx/loc-17-kvm-sriov-ivshmem" local || true
    "$ctx/net-16-kvm-sriov-ib" network || true
    "$ctx/net-90-kvm-sriov-sm" network || true
    if [ $hostfile = yes ]; then "$ctx/net-95-kvm-sriov-hostfile" network || true; fi
fi
