#!/usr/bin/env bash
# A small InfiniBand cluster: N HPC nodes on one IB partition.
#   templates/cluster/create-cluster.sh [N] [NAME_PREFIX]      (default 4, ib-node)
# Run as an OpenNebula user on the front-end (the one* CLI). Creates the
# partition network and the VM template when they do not exist yet, then
# instantiates N nodes named <prefix>-0 .. <prefix>-(N-1). The scheduler
# places each node on a host with a free VF (SCHED_REQUIREMENTS), so N must
# not exceed the free VFs of the cluster (onehost show: KVM_SRIOV_FREE_VFS).
set -euo pipefail
n=${1:-4}
prefix=${2:-ib-node}
here=$(dirname "$(readlink -f "$0")")
net_tmpl="$here/../network/ib-partition.tmpl"
vm_tmpl="$here/../vm/ib-hpc-node.tmpl"

[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "N must be a positive number" >&2; exit 2; }

name_of() { sed -n 's/^NAME *= *"\(.*\)"/\1/p' "$1" | head -n1; }
net=$(name_of "$net_tmpl")
tmpl=$(name_of "$vm_tmpl")

if onevnet show "$net" >/dev/null 2>&1; then
    echo "network $net exists"
else
    onevnet create "$net_tmpl"
fi
if onetemplate show "$tmpl" >/dev/null 2>&1; then
    echo "template $tmpl exists"
else
    onetemplate create "$vm_tmpl"
fi

# %i is replaced by OpenNebula with 0..N-1
onetemplate instantiate "$tmpl" --multiple "$n" --name "${prefix}-%i"
echo "instantiated $n nodes (onevm list | grep ${prefix}-)"
