#!/usr/bin/env bash
# Register the OneFlow service templates ib-mpi-cluster-spread and
# ib-mpi-cluster-pack (docs/mpi-cluster.md) with what they use: the IB
# network template, the node VM template and the two VM groups. What exists
# already (by name, for the calling user) is reused.
#   templates/oneflow/create-ib-mpi-cluster.sh [MGMT_NETWORK]   (default "public")
# Run on the front-end as the user who will own the clusters (one* CLI,
# oneflow-template; ONEFLOW_URL when OneFlow is not on localhost:2474).
set -euo pipefail
mgmt=${1:-public}
here=$(dirname "$(readlink -f "$0")")

name_of() { sed -n 's/^NAME *= *"\(.*\)"/\1/p' "$1" | head -n1; }
# id_of KIND NAME: the ID of the calling user's object of that name, empty if none
id_of() { { "one$1" show "$2" -x 2>/dev/null || true; } | sed -n 's:^ *<ID>\([0-9]*\)</ID>.*:\1:p' | head -n1; }
ensure() { # ensure KIND FILE -> its ID (created when missing)
    local name id
    name=$(name_of "$2")
    id=$(id_of "$1" "$name")
    if [ -z "$id" ]; then
        id=$("one$1" create "$2" | sed -n 's/^ID: *\([0-9]*\)$/\1/p')
        echo "created $1 $name ($id)" >&2
    fi
    [[ $id =~ ^[0-9]+$ ]] || { echo "could not create $1 from $2" >&2; exit 1; }
    echo "$id"
}

mgmt_id=$(id_of vnet "$mgmt")
[ -n "$mgmt_id" ] || { echo "no network \"$mgmt\" for management: give its name as the argument" >&2; exit 2; }
net_id=$(ensure vntemplate "$here/ib-cluster-net.tmpl")
node_id=$(ensure template "$here/ib-mpi-node.tmpl")
ensure vmgroup "$here/ib-mpi-spread.vmgroup" >/dev/null
ensure vmgroup "$here/ib-mpi-pack.vmgroup" >/dev/null

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for kind in spread pack; do
    # the files name ID 0 for the node template and both networks: put the real ones in
    ruby -rjson -e '
        t = JSON.parse(File.read(ARGV[0]))
        t["roles"].each { |r| r["template_id"] = Integer(ARGV[1]) }
        t["networks_values"].each do |v|
            v["mgmt"]["id"] = ARGV[2] if v["mgmt"]
            v["ib"]["template_id"] = ARGV[3] if v["ib"]
        end
        puts JSON.pretty_generate(t)' \
        "$here/ib-mpi-cluster-$kind.json" "$node_id" "$mgmt_id" "$net_id" >"$tmp/$kind.json"
    if oneflow-template show "ib-mpi-cluster-$kind" >/dev/null 2>&1; then
        echo "service template ib-mpi-cluster-$kind exists" >&2
    else
        oneflow-template create "$tmp/$kind.json"
    fi
done
