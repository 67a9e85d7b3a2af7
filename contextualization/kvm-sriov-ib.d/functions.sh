# shellcheck shell=bash
# kvm-sriov guest library: InfiniBand VF inside an OpenNebula VM.
#
# Sourced by the one-context hooks loc-16-kvm-sriov-ib, net-16-kvm-sriov-ib
# and net-90-kvm-sriov-sm (installed in /etc/one-context.d/; this file lives
# in /etc/one-context.d/kvm-sriov-ib.d/, a directory one-contextd skips).
#
# Contracts (docs/conventions.md):
#   port GUID of context NIC N = m0:m1:m2:x:y:m3:m4:m5 from ETH<N>_MAC, x:y
#   the OpenNebula network (or 00:00); a VM's MACs are distinct, so the six
#   MAC bytes alone name the port
#   ETH<N>_{MAC,IP,MASK,MTU,VLAN_ID,IP6,IP6_PREFIX_LENGTH}, ETH<N>_IPOIB_MODE,
#   IB_IRQ_PROFILE, IB_INSTALL_STACK, IB_SUBNET_MANAGER, IB_SM_PRIORITY.
#
# Everything that touches the system goes through an overridable path so the
# tests can run this for real against a fake sysfs tree and real links in a
# network namespace:
#   IB_SYSFS_ROOT  (/sys)   class/infiniband, class/net, module, bus/pci
#   IB_IP          (ip)     IB_ETHTOOL (ethtool)   IB_MODPROBE (modprobe)
#   IB_STATE_DIR   (/run/kvm-sriov-ib)  status file
#   IB_SYSLOG      (YES)    also send messages to syslog via logger
#   IB_CHILD_WAIT  (10)     seconds to wait for a PKey child interface
#   IB_OS_RELEASE  (/etc/os-release)
#   IB_UPTIME      (/proc/uptime)       the monotonic clock an outage is timed on
#   IB_ONE_ENV     (/var/run/one-context/one_env)  OneGate endpoint, VM ID, token
#   IB_PORT_WAIT   (120)    seconds a hot-plugged port has to come back ACTIVE
# These (and IB_SM_TOOL, IB_SM_PARTITIONS, PATH) count only on a machine whose
# root made IB_TEST_MARKER (the tests): one-context exports every CONTEXT
# variable of the VM template, so elsewhere they would let a template choose
# what root runs here.
IB_TEST_MARKER=/etc/kvm-sriov-ib.test-overrides
# -O: owned by us, root, which alone can create files in /etc (no external command: PATH is not trusted yet)
if ! { [ -f "$IB_TEST_MARKER" ] && [ ! -L "$IB_TEST_MARKER" ] && [ -O "$IB_TEST_MARKER" ]; }; then
    unset IB_SYSFS_ROOT IB_IP IB_ETHTOOL IB_MODPROBE IB_STATE_DIR IB_SYSLOG IB_CHILD_WAIT \
        IB_OS_RELEASE IB_SM_TOOL IB_SM_PARTITIONS IB_UPTIME IB_ONE_ENV IB_PORT_WAIT
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
fi

: "${IB_SYSFS_ROOT:=/sys}"
: "${IB_IP:=ip}"
: "${IB_ETHTOOL:=ethtool}"
: "${IB_MODPROBE:=modprobe}"
: "${IB_STATE_DIR:=/run/kvm-sriov-ib}"
: "${IB_SYSLOG:=YES}"
: "${IB_CHILD_WAIT:=10}"
: "${IB_OS_RELEASE:=/etc/os-release}"
: "${IB_UPTIME:=/proc/uptime}"
: "${IB_ONE_ENV:=/var/run/one-context/one_env}"
[[ ${IB_PORT_WAIT:-} =~ ^[0-9]{1,4}$ ]] || IB_PORT_WAIT=120

IB_TAG=kvm-sriov-ib
IB_FAILURES=0
# netdevs configured by ib_configure_all, "ifname N" per line
IB_CONFIGURED=""

ib_log() {
    local level=$1
    shift
    printf '%s: %s: %s\n' "$IB_TAG" "$level" "$*"
    if [ "$IB_SYSLOG" = YES ] && [ -S /dev/log ] && command -v logger >/dev/null 2>&1; then
        local prio=info
        case "$level" in
            WARN) prio=warning ;;
            ERROR) prio=err ;;
        esac
        logger -t "$IB_TAG" -p "daemon.$prio" -- "$level: $*" 2>/dev/null || true
    fi
}
ib_info() { ib_log INFO "$@"; }
ib_warn() { ib_log WARN "$@"; }
ib_error() {
    ib_log ERROR "$@"
    IB_FAILURES=$((IB_FAILURES + 1))
}

# A context value as a log shows it: at most 64 characters, anything but
# letters, digits and . : % _ - as '?' (a value with a newline writes one line).
ib_shown() {
    local v=${1:0:64}
    printf '%s' "${v//[^[:alnum:].:%_-]/?}"
}

ib_upper() { printf '%s' "$1" | tr '[:lower:]' '[:upper:]'; }
ib_lower() { printf '%s' "$1" | tr '[:upper:]' '[:lower:]'; }

# Value of the context variable named $1 (empty when unset).
ib_ctx() {
    local name=$1
    printf '%s' "${!name:-}"
}

# First line of a sysfs attribute, empty if missing/unreadable.
ib_read() {
    local v=""
    [ -r "$1" ] && IFS= read -r v <"$1" 2>/dev/null
    printf '%s' "$v"
}

# ---------------------------------------------------------------- GUIDs

# MAC "02:00:0a:64:00:2a" -> port GUID "02000a000064002a": 16 hex digits,
# lower case, no separators: m0 m1 m2 00 00 m3 m4 m5.
ib_mac_to_port_guid() {
    local mac
    mac=$(ib_lower "$1")
    [[ $mac =~ ^([0-9a-f]{2}):([0-9a-f]{2}):([0-9a-f]{2}):([0-9a-f]{2}):([0-9a-f]{2}):([0-9a-f]{2})$ ]] || return 1
    printf '%s%s%s0000%s%s%s' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}" \
        "${BASH_REMATCH[4]}" "${BASH_REMATCH[5]}" "${BASH_REMATCH[6]}"
}

# What a port GUID and the MAC it derives from share: the GUID without its two
# middle bytes (the driver puts the OpenNebula network there; the guest does
# not know it, and needs not). "02000a000c64002a" -> "02000a64002a"
ib_guid_key() { printf '%s%s' "${1:0:6}" "${1:10:6}"; }

# GUID printed the way ibstat -p does: 0x02000a000064002a
ib_guid_pretty() { printf '0x%s' "$1"; }

# gids/0 "fe80:0000:0000:0000:0200:0a00:0064:002a" -> "02000a000064002a"
ib_gid_to_guid() {
    local gid
    gid=$(ib_lower "$1")
    [[ $gid =~ ^[0-9a-f]{4}(:[0-9a-f]{4}){7}$ ]] || return 1
    gid=${gid//:/}
    printf '%s' "${gid:16:16}"
}

# IPoIB hardware address (20 bytes: 4 QPN/flags + 16 GID) -> port GUID
ib_hwaddr_to_guid() {
    local a
    a=$(ib_lower "$1")
    a=${a//:/}
    [ ${#a} -eq 40 ] || return 1
    printf '%s' "${a:24:16}"
}

# ---------------------------------------------------------------- discovery

ib_class_dir() { printf '%s/class/infiniband' "$IB_SYSFS_ROOT"; }
ib_net_dir() { printf '%s/class/net' "$IB_SYSFS_ROOT"; }

# "dev port" for every InfiniBand-link-layer port (RoCE ports are skipped).
ib_ports() {
    local d p ll
    for d in "$(ib_class_dir)"/*; do
        [ -d "$d/ports" ] || continue
        for p in "$d"/ports/*; do
            [ -d "$p" ] || continue
            ll=$(ib_read "$p/link_layer")
            [ -z "$ll" ] || [ "$ll" = InfiniBand ] || continue
            printf '%s %s\n' "${d##*/}" "${p##*/}"
        done
    done
}

ib_port_guid() {
    ib_gid_to_guid "$(ib_read "$(ib_class_dir)/$1/ports/$2/gids/0")"
}

# "dev port guid" of the IB port whose port GUID derives from the same MAC
# as GUID $1 (ib_guid_key).
ib_find_port() {
    local want dev port guid
    want=$(ib_guid_key "$1")
    while read -r dev port; do
        guid=$(ib_port_guid "$dev" "$port")
        if [ -n "$guid" ] && [ "$(ib_guid_key "$guid")" = "$want" ]; then
            printf '%s %s %s\n' "$dev" "$port" "$guid"
            return 0
        fi
    done < <(ib_ports)
    return 1
}

# The parent IPoIB netdev of IB port ($1 dev, $2 port, $3 guid).
# 1. an ARPHRD_INFINIBAND (type 32) netdev with create_child (parents only)
#    whose hardware address carries the port GUID;
# 2. the device's own net/ entries with dev_port (or the older dev_id)
#    equal to port-1.
ib_port_netdev() {
    local dev=$1 port=$2 guid=$3 n name
    for n in "$(ib_net_dir)"/*; do
        [ "$(ib_read "$n/type")" = 32 ] || continue
        [ -e "$n/create_child" ] || continue
        if [ "$(ib_hwaddr_to_guid "$(ib_read "$n/address")")" = "$guid" ]; then
            printf '%s' "${n##*/}"
            return 0
        fi
    done
    for n in "$(ib_class_dir)/$dev"/device/net/*; do
        [ -e "$n" ] || continue
        name=${n##*/}
        [ -e "$(ib_net_dir)/$name/create_child" ] || continue
        local idx
        idx=$(ib_read "$n/dev_port")
        [ -n "$idx" ] && [ "$idx" != 0 ] || idx=$(ib_read "$n/dev_id")
        if [ $((idx)) -eq $((port - 1)) ]; then
            printf '%s' "$name"
            return 0
        fi
    done
    return 1
}

# Context NIC indexes (N of ETH<N>_MAC), sorted numerically.
ib_context_nics() {
    local v
    for v in $(compgen -v ETH); do
        [[ $v =~ ^ETH([0-9]+)_MAC$ ]] && printf '%s\n' "${BASH_REMATCH[1]}"
    done | sort -n
}

# Is there an ordinary (non-IPoIB) netdev with this MAC?  (= not our NIC)
ib_is_ethernet_mac() {
    local mac n
    mac=$(ib_lower "$1")
    for n in "$(ib_net_dir)"/*; do
        [ "$(ib_lower "$(ib_read "$n/address")")" = "$mac" ] && return 0
    done
    return 1
}

# Mellanox PCI functions present? (to explain a missing IB device)
ib_mellanox_pci() {
    local d
    for d in "$IB_SYSFS_ROOT"/bus/pci/devices/*; do
        [ "$(ib_read "$d/vendor")" = 0x15b3 ] && printf '%s %s\n' "${d##*/}" "$(ib_read "$d/device")"
    done
}

ib_have_devices() {
    local d
    for d in "$(ib_class_dir)"/*; do
        [ -d "$d" ] && return 0
    done
    return 1
}

# Explain, once, why there is nothing to do; always "succeeds".
ib_report_no_device() {
    local pci
    pci=$(ib_mellanox_pci)
    if [ -n "$pci" ]; then
        ib_warn "Mellanox PCI function(s) present but no InfiniBand device in $(ib_class_dir):" \
            "$(printf '%s' "$pci" | tr '\n' ' ')- is the mlx5_ib/mlx4_ib kernel module available?"
    else
        ib_info "no InfiniBand device in $(ib_class_dir) (no VF attached to this VM?): nothing to configure"
    fi
}

# ---------------------------------------------------------------- modules

ib_module_loaded() { [ -d "$IB_SYSFS_ROOT/module/$1" ]; }

ib_modprobe() {
    local m=$1
    ib_module_loaded "$m" && return 0
    if "$IB_MODPROBE" "$m" >/dev/null 2>&1; then
        ib_info "loaded kernel module $m"
    else
        ib_warn "could not load kernel module $m"
        return 1
    fi
}

# mlx5_ib / mlx4_ib for the ConnectX generation present, then IPoIB and the
# user-space access modules (umad for diagnostics/opensm, ucm for rdma_cm).
ib_load_modules() {
    local want_mlx5=no want_mlx4=no pci dev id
    ib_module_loaded mlx5_core && want_mlx5=yes
    ib_module_loaded mlx4_core && want_mlx4=yes
    pci=$(ib_mellanox_pci)
    if [ -n "$pci" ]; then
        while read -r dev id; do
            : "$dev"
            case "$id" in
                0x1002 | 0x1003 | 0x1004 | 0x1007) want_mlx4=yes ;;
                *) want_mlx5=yes ;;
            esac
        done <<<"$pci"
    fi
    if [ "$want_mlx5" = no ] && [ "$want_mlx4" = no ]; then
        return 0 # nothing Mellanox here: do not load drivers for nothing
    fi
    [ "$want_mlx5" = yes ] && ib_modprobe mlx5_ib
    [ "$want_mlx4" = yes ] && ib_modprobe mlx4_ib
    ib_modprobe ib_ipoib
    ib_modprobe ib_umad
    ib_modprobe rdma_ucm
    return 0
}

# ---------------------------------------------------------------- values

# 255.255.0.0 -> 16 (also accepts a prefix length as is)
ib_mask_to_prefix() {
    local mask=$1 bits=0 o
    if [[ $mask =~ ^[0-9]+$ ]] && [ "$mask" -le 32 ]; then
        printf '%s' "$mask"
        return 0
    fi
    [[ $mask =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || return 1
    local seen_zero=no
    for o in ${mask//./ }; do
        case "$o" in
            255) [ $seen_zero = no ] || return 1; bits=$((bits + 8)) ;;
            254 | 252 | 248 | 240 | 224 | 192 | 128 | 0)
                [ $seen_zero = no ] || [ "$o" = 0 ] || return 1
                local b=$o
                while [ "$b" -gt 0 ]; do
                    bits=$((bits + 1))
                    b=$(((b << 1) & 255))
                done
                seen_zero=yes
                ;;
            *) return 1 ;;
        esac
    done
    printf '%s' "$bits"
}

# VLAN_ID (the PKey: "0x8001", "0x0001" or decimal) -> 15-bit key, e.g. 1.
ib_pkey_base() {
    local v=$1 n
    if [[ $v =~ ^0[xX][0-9a-fA-F]{1,4}$ ]]; then
        n=$((v))
    elif [[ $v =~ ^[0-9]{1,5}$ ]]; then
        n=$((10#$v))
    else
        return 1
    fi
    [ "$n" -le 65535 ] || return 1
    n=$((n & 0x7fff))
    [ "$n" -gt 0 ] || return 1
    printf '%s' "$n"
}

# ---------------------------------------------------------------- configure

ib_link_mtu() {
    "$IB_IP" -o link show dev "$1" 2>/dev/null | sed -n 's/.* mtu \([0-9]*\).*/\1/p'
}

ib_set_mode() {
    local ifc=$1 mode=$2 f cur
    f="$(ib_net_dir)/$ifc/mode"
    cur=$(ib_read "$f")
    if [ -z "$cur" ]; then
        ib_warn "$ifc: no $f: cannot select IPoIB mode $mode"
        return 0
    fi
    if [ "$cur" = "$mode" ]; then
        ib_info "$ifc: mode $mode (unchanged)"
        return 0
    fi
    if printf '%s\n' "$mode" >"$f" 2>/dev/null; then
        ib_info "$ifc: mode $cur -> $mode"
    else
        ib_error "$ifc: could not switch IPoIB mode to $mode"
    fi
}

ib_set_mtu() {
    local ifc=$1 mtu=$2 cur
    cur=$(ib_link_mtu "$ifc")
    if [ "$cur" = "$mtu" ]; then
        ib_info "$ifc: mtu $mtu (unchanged)"
    elif "$IB_IP" link set dev "$ifc" mtu "$mtu"; then
        ib_info "$ifc: mtu ${cur:-?} -> $mtu"
    else
        ib_error "$ifc: could not set mtu $mtu"
    fi
}

# Exactly one global address of the family on the interface: ours.
ib_set_addr() {
    local ifc=$1 fam=$2 want=$3 have a found=no
    have=$("$IB_IP" "$fam" -o addr show dev "$ifc" scope global 2>/dev/null | awk '{print $4}')
    for a in $have; do
        if [ "$a" = "$want" ]; then
            found=yes
        else
            "$IB_IP" "$fam" addr del "$a" dev "$ifc" && ib_info "$ifc: removed stale address $a"
        fi
    done
    if [ $found = yes ]; then
        ib_info "$ifc: address $want (unchanged)"
    elif "$IB_IP" "$fam" addr add "$want" dev "$ifc"; then
        ib_info "$ifc: address $want"
    else
        ib_error "$ifc: could not add address $want"
    fi
}

ib_link_up() {
    local ifc=$1
    if "$IB_IP" -o link show dev "$ifc" 2>/dev/null | grep -q '[<,]UP[,>]'; then
        return 0
    fi
    "$IB_IP" link set dev "$ifc" up || ib_error "$ifc: could not set link up"
}

# The netdev to carry context NIC traffic: the parent when its PKey (index 0)
# already is the network's, else the PKey child <parent>.<8000|pkey>, created
# through the parent's create_child when missing. Result in IB_PKEY_IFC (not
# printed: the function logs, and must run in this shell to count failures).
ib_pkey_netdev() {
    local parent=$1 vlan=$2 base ppkey child f i
    IB_PKEY_IFC=$parent
    if [ -z "$vlan" ]; then
        return 0
    fi
    if ! base=$(ib_pkey_base "$vlan"); then
        ib_error "$parent: VLAN_ID '$vlan' is not a PKey (0x0001-0x7fff, with or without the 0x8000 bit)"
        return 1
    fi
    if [ "$base" -eq $((0x7fff)) ]; then # the default partition: the parent
        return 0
    fi
    ppkey=$(ib_read "$(ib_net_dir)/$parent/pkey")
    if [ -n "$ppkey" ] && [ $((ppkey & 0x7fff)) -eq "$base" ]; then
        return 0
    fi
    child=$(printf '%s.%04x' "$parent" $((base | 0x8000)))
    if [ ! -e "$(ib_net_dir)/$child" ]; then
        f="$(ib_net_dir)/$parent/create_child"
        if ! printf '0x%04x\n' $((base | 0x8000)) >"$f" 2>/dev/null; then
            ib_error "$parent: could not create PKey child $child through $f"
            return 1
        fi
        ib_info "$parent: created PKey child $child"
        i=0
        while [ ! -e "$(ib_net_dir)/$child" ]; do
            if [ "$i" -ge "$IB_CHILD_WAIT" ]; then
                ib_error "$parent: PKey child $child did not appear within ${IB_CHILD_WAIT}s"
                return 1
            fi
            sleep 1
            i=$((i + 1))
        done
    fi
    IB_PKEY_IFC=$child
}

# Configure context NIC $1 if it is one of our IB ports.
# Returns 0 configured, 1 failed, 2 not an IB NIC.
ib_configure_nic() {
    local n=$1 mac guid dev port parent ifc ip mask prefix mtu mode vlan method ip6 p6
    mac=$(ib_ctx "ETH${n}_MAC")
    if ! guid=$(ib_mac_to_port_guid "$mac"); then
        ib_warn "ETH$n: MAC '$mac' is not a MAC address: skipped"
        return 2
    fi
    if ! read -r dev port guid < <(ib_find_port "$guid"); then
        if ! ib_is_ethernet_mac "$mac"; then
            ib_warn "ETH$n ($mac): no netdev with this MAC and no IB port with GUID $(ib_guid_pretty "$guid")"
        fi
        return 2
    fi
    if ! parent=$(ib_port_netdev "$dev" "$port" "$guid"); then
        ib_error "ETH$n: IB port $dev/$port (GUID $(ib_guid_pretty "$guid")) has no IPoIB interface (is ib_ipoib loaded?)"
        return 1
    fi
    ib_info "ETH$n ($mac) is IB port $dev/$port GUID $(ib_guid_pretty "$guid") netdev $parent"

    vlan=$(ib_ctx "ETH${n}_VLAN_ID")
    ib_pkey_netdev "$parent" "$vlan" || return 1
    ifc=$IB_PKEY_IFC

    mode=$(ib_lower "$(ib_ctx "ETH${n}_IPOIB_MODE")")
    case "$mode" in
        "") mode=datagram ;;
        datagram | connected) ;;
        *)
            ib_warn "ETH$n: ETH${n}_IPOIB_MODE '$mode' is not datagram|connected: using datagram"
            mode=datagram
            ;;
    esac
    mtu=$(ib_ctx "ETH${n}_MTU")
    if [ -n "$mtu" ] && ! [[ $mtu =~ ^[0-9]+$ ]]; then
        ib_warn "ETH$n: MTU '$mtu' is not a number: ignored"
        mtu=""
    fi
    if [ "$mode" = datagram ] && [ -n "$mtu" ] && [ "$mtu" -gt 4092 ]; then
        ib_warn "ETH$n: MTU $mtu is above the datagram-mode maximum: using 4092 (set ETH${n}_IPOIB_MODE=connected for up to 65520)"
        mtu=4092
    fi
    if [ "$mode" = connected ] && [ -z "$mtu" ]; then
        mtu=65520
    fi
    [ -n "$mtu" ] && [ "$mtu" -gt 65520 ] && mtu=65520

    # the parent must be up for a child to come up
    [ "$ifc" = "$parent" ] || ib_link_up "$parent"
    # mode first: the kernel resets the MTU when the mode changes
    ib_set_mode "$ifc" "$mode"
    [ -n "$mtu" ] && ib_set_mtu "$ifc" "$mtu"

    method=$(ib_lower "$(ib_ctx "ETH${n}_METHOD")")
    ip=$(ib_ctx "ETH${n}_IP")
    mask=$(ib_ctx "ETH${n}_MASK")
    if [ "$method" = dhcp ]; then
        ib_warn "ETH$n: METHOD=dhcp is not supported on IPoIB by these scripts: no IPv4 address set"
    elif [ -n "$ip" ]; then
        [ -n "$mask" ] || mask=255.255.255.0
        if ! [[ $ip =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]]; then
            ib_error "ETH$n: IP '$(ib_shown "$ip")' is not an IPv4 address"
        elif prefix=$(ib_mask_to_prefix "$mask"); then
            ib_set_addr "$ifc" -4 "$ip/$prefix"
        else
            ib_error "ETH$n: MASK '$(ib_shown "$mask")' is not a netmask"
        fi
    else
        ib_warn "ETH$n: no ETH${n}_IP in the context: $ifc gets no IPv4 address"
    fi
    ip6=$(ib_ctx "ETH${n}_IP6")
    if [ -n "$ip6" ]; then
        p6=$(ib_ctx "ETH${n}_IP6_PREFIX_LENGTH")
        p6=${p6:-64}
        # IPv6 text alone: no scope id (%...), no blank or second line
        if ! [[ $ip6 =~ ^[0-9A-Fa-f:.]{2,45}$ ]]; then
            ib_error "ETH$n: IP6 '$(ib_shown "$ip6")' is not an IPv6 address"
        elif ! [[ $p6 =~ ^[0-9]{1,3}$ ]] || [ "$p6" -gt 128 ]; then
            ib_error "ETH$n: IP6_PREFIX_LENGTH '$(ib_shown "$p6")' is not 0..128"
        else
            ib_set_addr "$ifc" -6 "$ip6/$p6"
        fi
    fi
    ib_link_up "$ifc"
    IB_CONFIGURED+="$ifc $n"$'\n'
    return 0
}

# Configure every context NIC that is an IB port; report ports nobody claims.
ib_configure_all() {
    local n rc claimed="" dev port guid
    IB_CONFIGURED=""
    for n in $(ib_context_nics); do
        rc=0
        ib_configure_nic "$n" || rc=$?
        [ "$rc" -eq 2 ] || claimed+=" $(ib_guid_key "$(ib_mac_to_port_guid "$(ib_ctx "ETH${n}_MAC")")")"
    done
    while read -r dev port; do
        guid=$(ib_port_guid "$dev" "$port")
        case " $claimed " in
            *" $(ib_guid_key "$guid") "*) ;;
            *) ib_warn "IB port $dev/$port GUID $(ib_guid_pretty "${guid:-unknown}") matches no context NIC" \
                "(GUID = MAC m0:m1:m2:x:y:m3:m4:m5; was the VF given its GUID by the kvm-sriov driver?)" ;;
        esac
    done < <(ib_ports)
}

# ---------------------------------------------------------------- interrupts

# Interrupt-moderation profiles (paper 000: SR-IOV InfiniBand latency in
# blocking mode improves when moderation is made less aggressive):
#   default      driver defaults, nothing changed (adaptive moderation on)
#   low-latency  adaptive-rx off, rx-frames 1, rx-usecs 0  (the paper's "RX1":
#                VM osu_latency 64 B 7.06 -> 5.40 us)
#   throughput   adaptive-rx off, rx-frames 88, rx-usecs 40 (the driver's
#                frame trigger kept, the paper's 40 us lower timer bound)
# IB_IRQ_ADAPTIVE_RX / IB_IRQ_RX_FRAMES / IB_IRQ_RX_USECS override one value.
ib_irq_settings() {
    local profile adaptive="" frames="" usecs=""
    profile=$(ib_lower "${IB_IRQ_PROFILE:-default}")
    case "$profile" in
        default | "") ;;
        low-latency) adaptive=off frames=1 usecs=0 ;;
        throughput) adaptive=off frames=88 usecs=40 ;;
        *) return 1 ;; # unknown profile: the caller warns
    esac
    [ -n "${IB_IRQ_ADAPTIVE_RX:-}" ] && adaptive=$(ib_lower "$IB_IRQ_ADAPTIVE_RX")
    [ -n "${IB_IRQ_RX_FRAMES:-}" ] && frames=$IB_IRQ_RX_FRAMES
    [ -n "${IB_IRQ_RX_USECS:-}" ] && usecs=$IB_IRQ_RX_USECS
    [ -n "$adaptive" ] && printf 'adaptive-rx %s\n' "$adaptive"
    [ -n "$frames" ] && printf 'rx-frames %s\n' "$frames"
    [ -n "$usecs" ] && printf 'rx-usecs %s\n' "$usecs"
    return 0
}

# One setting at a time: IPoIB (ipoib_ethtool) knows rx-usecs/rx-frames only,
# enhanced IPoIB (mlx5i) also adaptive-rx; unsupported ones are reported.
ib_apply_irq_profile() {
    local ifc=$1 key val out rc settings
    if ! settings=$(ib_irq_settings); then
        ib_warn "IB_IRQ_PROFILE '$IB_IRQ_PROFILE' is not default|low-latency|throughput: interrupts left alone"
        return 0
    fi
    if [ -z "$settings" ]; then
        ib_info "$ifc: interrupt moderation left at driver defaults (IB_IRQ_PROFILE=${IB_IRQ_PROFILE:-default})"
        return 0
    fi
    if ! command -v "$IB_ETHTOOL" >/dev/null 2>&1; then
        ib_warn "$ifc: ethtool not installed: cannot apply IB_IRQ_PROFILE=$IB_IRQ_PROFILE"
        return 0
    fi
    while read -r key val; do
        rc=0
        out=$("$IB_ETHTOOL" -C "$ifc" "$key" "$val" 2>&1) || rc=$?
        case "$rc" in
            0) ib_info "$ifc: $key $val" ;;
            80) ib_info "$ifc: $key $val (unchanged)" ;; # ethtool: nothing changed
            *) ib_warn "$ifc: $key $val not applied (driver: $(printf '%s' "$out" | tr '\n' ' '))" ;;
        esac
    done <<<"$settings"
}

# ---------------------------------------------------------------- status

# One line per IB port: device/port, GUID, state, LID, SM LID, rate, netdev.
ib_status() {
    local dev port pdir guid state phys lid smlid rate ifc="" line n out="" parent=""
    mkdir -p "$IB_STATE_DIR" 2>/dev/null || true
    while read -r dev port; do
        pdir="$(ib_class_dir)/$dev/ports/$port"
        guid=$(ib_port_guid "$dev" "$port")
        state=$(ib_read "$pdir/state")
        state=${state#*: }
        phys=$(ib_read "$pdir/phys_state")
        phys=${phys#*: }
        lid=$(ib_read "$pdir/lid")
        smlid=$(ib_read "$pdir/sm_lid")
        rate=$(ib_read "$pdir/rate")
        parent=$(ib_port_netdev "$dev" "$port" "$guid") || parent=""
        ifc=""
        while read -r line n; do
            [ -n "$line" ] || continue
            if [ "$line" = "$parent" ] || [ "${line%.*}" = "$parent" ]; then
                ifc="$line(ETH$n)"
            fi
        done <<<"$IB_CONFIGURED"
        [ -n "$ifc" ] || ifc=${parent:-none}
        line="port $dev/$port guid $(ib_guid_pretty "${guid:-unknown}") state ${state:-?} phys ${phys:-?} lid ${lid:-?} sm_lid ${smlid:-?} rate ${rate:-?} netdev $ifc"
        ib_info "$line"
        out+="$line"$'\n'
        case "$state" in
            INIT) ib_warn "$dev/$port is INIT: the link is up but no subnet manager has configured it yet (run opensm on a host, see IB_SUBNET_MANAGER)" ;;
            DOWN) ib_warn "$dev/$port is DOWN: no physical link (${phys:-?})" ;;
        esac
    done < <(ib_ports)
    printf '%s' "$out" >"$IB_STATE_DIR/status" 2>/dev/null || true
}

# ---------------------------------------------------------------- user stack

# rdma-core (udev rules, rdma-ndd, providers), ibverbs utilities, infiniband-diags
ib_stack_present() {
    command -v ibstat >/dev/null 2>&1 && command -v ibv_devinfo >/dev/null 2>&1 &&
        command -v rdma-ndd >/dev/null 2>&1
}

# apt | dnf | yum | "" from /etc/os-release (ID + ID_LIKE) and what exists
ib_pkg_family() {
    local ids=""
    if [ -r "$IB_OS_RELEASE" ]; then
        ids=$(sed -n 's/^\(ID\|ID_LIKE\)=//p' "$IB_OS_RELEASE" | tr -d '"' | tr '\n' ' ')
    fi
    case " $ids " in
        *" debian "* | *" ubuntu "*) command -v apt-get >/dev/null 2>&1 && { echo apt; return 0; } ;;
        *" rhel "* | *" fedora "* | *" centos "* | *" rocky "* | *" almalinux "*)
            command -v dnf >/dev/null 2>&1 && { echo dnf; return 0; }
            command -v yum >/dev/null 2>&1 && { echo yum; return 0; }
            ;;
    esac
    return 1
}

ib_install_stack() {
    local want fam
    want=$(ib_upper "${IB_INSTALL_STACK:-YES}")
    if ib_stack_present; then
        ib_info "IB user stack present (rdma-core, ibverbs utilities, infiniband-diags)"
        return 0
    fi
    if [ "$want" = NO ]; then
        ib_warn "IB user stack missing and IB_INSTALL_STACK=NO: not installing"
        return 0
    fi
    if ! fam=$(ib_pkg_family); then
        ib_warn "IB user stack missing and this distribution is neither Debian/Ubuntu nor RHEL-family: install rdma-core, ibverbs utilities and infiniband-diags yourself"
        return 0
    fi
    ib_info "installing the IB user stack with $fam"
    case "$fam" in
        apt)
            local pkgs=(rdma-core ibverbs-utils ibverbs-providers infiniband-diags)
            if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1; then
                DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1
                DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1 ||
                    { ib_error "apt-get install ${pkgs[*]} failed"; return 1; }
            fi
            ;;
        dnf | yum)
            "$fam" install -y -q rdma-core libibverbs-utils infiniband-diags >/dev/null 2>&1 ||
                { ib_error "$fam install rdma-core libibverbs-utils infiniband-diags failed"; return 1; }
            ;;
    esac
    ib_info "IB user stack installed"
}

# ---------------------------------------------------------------- entries

# Modules, IPoIB from the context, interrupt profile, status. Always returns
# 0 when there is no IB device (the boot goes on); 1 when something failed.
ib_run_configure() {
    local ifc n
    ib_save_context
    ib_load_modules
    if ! ib_have_devices; then
        ib_report_no_device
        mkdir -p "$IB_STATE_DIR" 2>/dev/null && printf 'no InfiniBand device\n' >"$IB_STATE_DIR/status"
        return 0
    fi
    ib_configure_all
    while read -r ifc n; do
        [ -n "$ifc" ] && ib_apply_irq_profile "$ifc"
    done <<<"$IB_CONFIGURED"
    ib_status
    [ "$IB_FAILURES" -eq 0 ]
}

# ---------------------------------------------------------------- hot-plug

# A VF hot-unplugged and plugged again (a live migration, a save and restore)
# takes the IB device away and brings a new one (other PCI address, other
# device and netdev names, the same GUIDs). kvm-sriov-ib-hotplug, run by udev,
# times that outage on this guest's monotonic clock, configures the new port
# as the boot did and reports through OneGate. The state lives in
# IB_STATE_DIR (/run): context (what the boot hooks were given: udev gives a
# handler no context), outage.pending, last-outage, lock.

# Run "$@" in this shell holding the state folder's lock, so that the boot
# hooks, one-context's re-runs and the hot-plug handler never configure nor
# touch the outage record at once. At most IB_LOCK_WAIT seconds to get it
# (the holders keep it for a configuration at most), then without it.
IB_LOCK_WAIT=30
ib_locked() {
    local rc=0
    mkdir -p "$IB_STATE_DIR" 2>/dev/null || true
    if ! command -v flock >/dev/null 2>&1; then
        ib_warn "flock is not installed (util-linux): going on without the lock"
        "$@"
        return
    fi
    if ! { exec 9>>"$IB_STATE_DIR/lock"; } 2>/dev/null; then
        "$@"
        return
    fi
    flock -w "$IB_LOCK_WAIT" 9 || ib_warn "$IB_STATE_DIR/lock still held after ${IB_LOCK_WAIT}s: going on without it"
    "$@" || rc=$?
    exec 9>&-
    return "$rc"
}

# Run "$@" apart from the caller, which must not wait for it: udev kills what
# a rule started once the event is handled, one-context waits for its hooks.
# A transient systemd unit where systemd runs (the handler exits 0: nothing
# stays loaded), else a new session.
ib_detached() {
    if command -v systemd-run >/dev/null 2>&1 &&
        systemd-run --no-block --description="kvm-sriov InfiniBand: ${*##*/}" -- "$@" \
            </dev/null >/dev/null 2>&1; then
        return 0
    fi
    if command -v setsid >/dev/null 2>&1; then
        setsid "$@" </dev/null >/dev/null 2>&1 &
    else
        "$@" </dev/null >/dev/null 2>&1 &
    fi
}

# This guest's monotonic clock in hundredths of a second (/proc/uptime: never
# set or stepped, unlike the wall clock NTP corrects after a migration).
ib_clock() {
    local up
    up=$(ib_read "$IB_UPTIME")
    up=${up%% *}
    [[ $up =~ ^([0-9]{1,12})\.([0-9]{2})$ ]] || return 1
    printf '%s' $((10#${BASH_REMATCH[1]} * 100 + 10#${BASH_REMATCH[2]}))
}

# hundredths -> "5.75"
ib_centis() { printf '%d.%02d' $(($1 / 100)) $(($1 % 100)); }

IB_CONTEXT_VARS='^(ETH[0-9]{1,4}_(MAC|IP|MASK|MTU|VLAN_ID|IPOIB_MODE|IP6|IP6_PREFIX_LENGTH|METHOD)|IB_IRQ_(PROFILE|ADAPTIVE_RX|RX_FRAMES|RX_USECS))$'

# The context variables the IB configuration reads, as the boot hooks got
# them, for the hot-plug handler (root's only; quoted by bash's printf %q).
ib_save_context() {
    local v out=""
    for v in $(compgen -v); do
        [[ $v =~ $IB_CONTEXT_VARS ]] && out+=$(printf 'export %s=%q' "$v" "${!v}")$'\n'
    done
    mkdir -p "$IB_STATE_DIR" 2>/dev/null || return 0
    (umask 077 && printf '%s' "$out" >"$IB_STATE_DIR/context.new" &&
        mv -f "$IB_STATE_DIR/context.new" "$IB_STATE_DIR/context") 2>/dev/null || true
}

ib_load_context() {
    local f="$IB_STATE_DIR/context"
    [ -f "$f" ] && [ ! -L "$f" ] && [ -O "$f" ] || return 1
    # shellcheck source=/dev/null
    . "$f"
}

# GUID key (ib_guid_key) -> a GUID that ib_find_port matches on it
ib_key_guid() { printf '%s0000%s' "${1:0:6}" "${1:6:6}"; }

# The GUID keys of the context NICs, space-separated.
ib_context_keys() {
    local n guid out=""
    for n in $(ib_context_nics); do
        guid=$(ib_mac_to_port_guid "$(ib_ctx "ETH${n}_MAC")") && out+=" $(ib_guid_key "$guid")"
    done
    printf '%s' "${out# }"
}

# The GUID keys of the IB ports here now, but those of device $1 (going away).
ib_present_keys() {
    local gone=${1:-} dev port guid out=""
    while read -r dev port; do
        [ "$dev" != "$gone" ] || continue
        guid=$(ib_port_guid "$dev" "$port") && [ -n "$guid" ] && out+=" $(ib_guid_key "$guid")"
    done < <(ib_ports)
    printf '%s' "${out# }"
}

# The GUID keys of the ports the last configuration saw (its status file).
ib_status_keys() {
    local g out=""
    while read -r g; do
        out+=" $(ib_guid_key "$g")"
    done < <(sed -n 's/^port [^ ]* guid 0x\([0-9a-f]\{16\}\) .*/\1/p' "$IB_STATE_DIR/status" 2>/dev/null | head -n 64)
    printf '%s' "${out# }"
}

ib_in() { [[ " $2 " == *" $1 "* ]]; }

# The outage being timed: IB_PENDING_START (first removal), IB_PENDING_LAST
# (latest removal), IB_PENDING_KEYS (the ports still to come back), all ""
# when none. Keys of NICs no longer in the context (a NIC detached for good)
# are dropped, so they never hold up a later outage. Under ib_locked.
IB_PENDING_FILE=outage.pending
ib_pending_read() {
    local f="$IB_STATE_DIR/$IB_PENDING_FILE" w1 start w2 last w3 keys ctx k kept=""
    IB_PENDING_START="" IB_PENDING_LAST="" IB_PENDING_KEYS=""
    [ -e "$f" ] || return 0
    read -r w1 start w2 last w3 keys < <(head -c 4096 "$f" 2>/dev/null)
    if [ ! -f "$f" ] || [ -L "$f" ] || [ "${w1:-}" != start ] || [ "${w2:-}" != last ] || [ "${w3:-}" != keys ] ||
        ! [[ ${start:-} =~ ^[0-9]{1,15}$ && ${last:-} =~ ^[0-9]{1,15}$ ]] ||
        ! [[ ${keys:-} =~ ^[0-9a-f]{12}( [0-9a-f]{12}){0,63}$ ]]; then
        ib_warn "$f is not an outage record: dropped"
        rm -f "$f"
        return 0
    fi
    ctx=$(ib_context_keys)
    for k in $keys; do
        ib_in "$k" "$ctx" && kept+=" $k"
    done
    kept=${kept# }
    [ "$kept" = "$keys" ] || ib_pending_write "$start" "$last" "$kept"
    [ -n "$kept" ] || return 0
    IB_PENDING_START=$start IB_PENDING_LAST=$last IB_PENDING_KEYS=$kept
}

ib_pending_write() { # start last keys ("" keys: no outage being timed)
    local f="$IB_STATE_DIR/$IB_PENDING_FILE"
    if [ -z "$3" ]; then
        rm -f "$f"
        return 0
    fi
    printf 'start %s last %s keys %s\n' "$1" "$2" "$3" >"$f.new" && mv -f "$f.new" "$f"
}

# udev: IB device $1 went away at $2 (ib_clock, read before the lock). The
# ports of context NICs the last configuration saw and that are gone now
# start (or join) the outage being timed. Under ib_locked.
ib_outage_removed() {
    local dev=$1 now=$2 ctx present k gone=""
    ctx=$(ib_context_keys)
    present=$(ib_present_keys "$dev")
    for k in $(ib_status_keys); do
        ib_in "$k" "$ctx" && ! ib_in "$k" "$present" && ! ib_in "$k" "$gone" && gone+=" $k"
    done
    gone=${gone# }
    if [ -z "$gone" ]; then
        ib_info "IB device $dev removed: no port of a context NIC went with it, nothing to time"
        return 0
    fi
    ib_pending_read
    local start=$now keys=$gone
    if [ -n "$IB_PENDING_KEYS" ]; then
        start=$IB_PENDING_START
        for k in $IB_PENDING_KEYS; do
            ib_in "$k" "$keys" || keys+=" $k"
        done
    fi
    ib_pending_write "$start" "$now" "$keys" ||
        { ib_error "could not write $IB_STATE_DIR/$IB_PENDING_FILE: the outage is not timed"; return 1; }
    ib_info "IB device $dev removed: the InfiniBand outage is timed until its ports are ACTIVE again"
}

# Every port of the keys $1 there with its IPoIB netdev?
ib_ports_back() {
    local k dev port guid
    for k in $1; do
        read -r dev port guid < <(ib_find_port "$(ib_key_guid "$k")") || return 1
        ib_port_netdev "$dev" "$port" "$guid" >/dev/null || return 1
    done
}

# The ports of the keys $1: IB_WORST_STATE (ACTIVE when all are, else the
# first other state, NONE for a port not there), IB_SEEN_PORTS (dev/port ...).
ib_ports_state() {
    local k dev port guid state
    IB_WORST_STATE=ACTIVE IB_SEEN_PORTS=""
    for k in $1; do
        if ! read -r dev port guid < <(ib_find_port "$(ib_key_guid "$k")"); then
            [ "$IB_WORST_STATE" != ACTIVE ] || IB_WORST_STATE=NONE
            continue
        fi
        IB_SEEN_PORTS+="${IB_SEEN_PORTS:+ }$dev/$port"
        state=$(ib_read "$(ib_class_dir)/$dev/ports/$port/state")
        state=${state#*: }
        [[ $state =~ ^[A-Z_]{1,16}$ ]] || state=UNKNOWN
        [ "$state" = ACTIVE ] || [ "$IB_WORST_STATE" != ACTIVE ] || IB_WORST_STATE=$state
    done
}

# Poll (bounded by IB_PORT_WAIT from the caller's $SECONDS $2) until the
# ports of the keys $1 are all ACTIVE; IB_WORST_STATE says how it ended.
ib_wait_active() {
    local keys=$1 deadline=$2
    while ib_ports_state "$keys"; [ "$IB_WORST_STATE" != ACTIVE ]; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.2 2>/dev/null || sleep 1
    done
}

# After an IB device came: wait for every port of the outage being timed
# (bounded), configure them as the boot did, wait for ACTIVE, then end the
# outage on this guest's clock and report it. Nothing being timed: nothing to
# do (new NICs are one-context's: their context changes with them).
ib_outage_settle() {
    local start last keys deadline end
    ib_locked ib_pending_read
    [ -n "$IB_PENDING_KEYS" ] || return 0
    start=$IB_PENDING_START last=$IB_PENDING_LAST keys=$IB_PENDING_KEYS
    deadline=$((SECONDS + IB_PORT_WAIT))
    until ib_ports_back "$keys"; do
        [ "$SECONDS" -lt "$deadline" ] || break
        sleep 0.2 2>/dev/null || sleep 1
    done
    ib_locked ib_run_configure || true
    ib_wait_active "$keys" "$deadline"
    end=$(ib_clock) || end=""
    # the status as it is now (the configuration saw the ports INIT)
    ib_locked ib_status
    ib_locked ib_outage_end "$start" "$last" "$keys" "$end" || return 0
    [ "${#IB_OUTAGE_REPORT[@]}" -eq 0 ] || ib_onegate_report "${IB_OUTAGE_REPORT[@]}"
}

# Under ib_locked: the outage ends here unless another removal came during
# the wait (then the next device's settle times it); returns 1 then.
# IB_OUTAGE_REPORT: the KEY=VALUE words for OneGate (and last-outage).
ib_outage_end() {
    local start=$1 last=$2 keys=$3 end=$4 seconds
    IB_OUTAGE_REPORT=()
    ib_pending_read
    if [ "$IB_PENDING_START $IB_PENDING_LAST $IB_PENDING_KEYS" != "$start $last $keys" ]; then
        return 1
    fi
    ib_pending_write "" "" ""
    if [ "$IB_WORST_STATE" != ACTIVE ]; then
        ib_warn "IB port(s) ${IB_SEEN_PORTS:-of the context NICs} not ACTIVE within ${IB_PORT_WAIT}s of the hot-plug" \
            "(state $IB_WORST_STATE; INIT: no subnet manager, NONE: no port): the outage is not timed"
        IB_OUTAGE_REPORT=("IB_STATE=$IB_WORST_STATE")
        return 0
    fi
    if [ -z "$end" ] || [ "$end" -lt "$start" ]; then
        ib_warn "cannot read the clock ($IB_UPTIME): the outage is not timed"
        IB_OUTAGE_REPORT=(IB_STATE=ACTIVE)
        return 0
    fi
    seconds=$(ib_centis $((end - start)))
    IB_OUTAGE_REPORT=(IB_STATE=ACTIVE "IB_OUTAGE_SECONDS=$seconds" "IB_OUTAGE_ENDED=$(date +%s)")
    ib_info "IB outage ${seconds}s, from the VF's removal until $IB_SEEN_PORTS ACTIVE (this guest's clock)"
    printf '%s\n' "${IB_OUTAGE_REPORT[@]}" >"$IB_STATE_DIR/last-outage.new" 2>/dev/null &&
        mv -f "$IB_STATE_DIR/last-outage.new" "$IB_STATE_DIR/last-outage"
    return 0
}

# At boot (net-16, detached): once the ports of the context NICs are ACTIVE
# (bounded), IB_STATE through OneGate. An outage being timed reports itself.
ib_report_state() {
    local ctx present k keys=""
    ctx=$(ib_context_keys)
    present=$(ib_present_keys)
    for k in $ctx; do
        ib_in "$k" "$present" && keys+=" $k"
    done
    [ -n "$keys" ] || return 0
    ib_locked ib_pending_read
    [ -z "$IB_PENDING_KEYS" ] || return 0
    ib_wait_active "$keys" $((SECONDS + IB_PORT_WAIT)) ||
        ib_warn "IB port(s) $IB_SEEN_PORTS not ACTIVE within ${IB_PORT_WAIT}s (state $IB_WORST_STATE)"
    ib_onegate_report "IB_STATE=$IB_WORST_STATE"
}

# ---------------------------------------------------------------- OneGate

# ONEGATE_ENDPOINT, VMID, TOKENTXT: the environment first, then one-context's
# one_env (its `export KEY="value"` lines, read as text, never run). Sets
# IB_ONEGATE_{ENDPOINT,VMID,TOKEN}; 1 when this VM has no usable OneGate.
ib_onegate_settings() {
    local name v url='^https?://[]A-Za-z0-9.:[-]{1,255}(/[A-Za-z0-9._~/-]{0,255})?$'
    for name in ONEGATE_ENDPOINT VMID TOKENTXT; do
        v=${!name:-}
        if [ -z "$v" ] && [ -f "$IB_ONE_ENV" ]; then
            v=$(head -c 1048576 "$IB_ONE_ENV" 2>/dev/null | sed -n "s/^export $name=\"\([^\"]*\)\"\$/\1/p" | head -n 1)
        fi
        printf -v "IB_ONEGATE_$name" '%s' "$v"
    done
    [[ $IB_ONEGATE_ONEGATE_ENDPOINT =~ $url ]] &&
        [[ $IB_ONEGATE_VMID =~ ^[0-9]{1,10}$ ]] && [[ $IB_ONEGATE_TOKENTXT =~ ^[A-Za-z0-9+/=]{4,512}$ ]]
}

# Put KEY=VALUE... ($@, values of ours) into this VM's USER_TEMPLATE through
# OneGate (PUT /vm, as onegate vm update does). Best effort: a VM without
# OneGate or curl, or a OneGate that does not answer within 10 s, is one line.
ib_onegate_report() {
    local out
    if ! ib_onegate_settings; then
        ib_info "no OneGate for this VM (CONTEXT TOKEN = \"YES\" gives one): $* not reported"
        return 0
    fi
    if ! command -v curl >/dev/null 2>&1; then
        ib_warn "curl is not installed: $* not reported to OneGate"
        return 0
    fi
    # the token in a config read from a pipe, not on the command line other users can read
    if out=$(curl -sS -f --connect-timeout 5 --max-time 10 -X PUT \
        -K <(printf 'header = "X-ONEGATE-TOKEN: %s"\n' "$IB_ONEGATE_TOKENTXT") \
        -H "X-ONEGATE-VMID: $IB_ONEGATE_VMID" --data-binary "$(printf '%s\n' "$@")" \
        "${IB_ONEGATE_ONEGATE_ENDPOINT%/}/vm" 2>&1); then
        ib_info "reported to OneGate: $*"
    else
        out=$(printf '%s' "$out" | tr -c '[:print:]' ' ' | cut -c1-200)
        ib_warn "OneGate at $IB_ONEGATE_ONEGATE_ENDPOINT did not take $* ($out)"
    fi
}

# ---------------------------------------------------------------- subnet manager

# PCI device IDs of ConnectX Virtual Functions (CX3/CX3Pro, Connect-IB,
# CX4, CX4Lx, CX5, CX5Ex, CX6, and the generic ConnectX VF 0x101e). A VF
# has no QP0, so it cannot send the SMPs a subnet manager needs.
IB_VF_DEVICE_IDS=" 0x1002 0x1004 0x1012 0x1014 0x1016 0x1018 0x101a 0x101c 0x101e "

ib_device_is_vf() {
    local id
    id=$(ib_read "$(ib_class_dir)/$1/device/device")
    [ -n "$id" ] && [[ $IB_VF_DEVICE_IDS == *" $id "* ]]
}

ib_install_opensm() {
    local fam
    command -v opensm >/dev/null 2>&1 && return 0
    if [ "$(ib_upper "${IB_INSTALL_STACK:-YES}")" = NO ]; then
        ib_error "IB_SUBNET_MANAGER=YES but opensm is not installed and IB_INSTALL_STACK=NO"
        return 1
    fi
    fam=$(ib_pkg_family) || { ib_error "opensm is not installed and no apt/dnf to install it"; return 1; }
    ib_info "installing opensm with $fam"
    case "$fam" in
        apt) DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends opensm >/dev/null 2>&1 ;;
        *) "$fam" install -y -q opensm >/dev/null 2>&1 ;;
    esac || { ib_error "could not install opensm"; return 1; }
}

# IB_SUBNET_MANAGER=YES: run OpenSM here with IB_SM_PRIORITY, on the
# partitions file the driver generates (delivered as a context file named
# partitions.conf, or already at IB_SM_PARTITIONS).
ib_run_subnet_manager() {
    local dev port vf=no parts
    if [ "$(ib_upper "${IB_SUBNET_MANAGER:-NO}")" != YES ]; then
        return 0
    fi
    if ! ib_have_devices; then
        ib_warn "IB_SUBNET_MANAGER=YES but there is no InfiniBand device: no subnet manager started"
        return 0
    fi
    while read -r dev port; do
        ib_device_is_vf "$dev" && vf=yes
    done < <(ib_ports)
    if [ $vf = yes ]; then
        ib_warn "IB_SUBNET_MANAGER=YES on an SR-IOV Virtual Function: VFs have no QP0 and cannot act as subnet manager;" \
            "run opensm on a host or on a VM with a whole (PF) HCA. Starting it anyway."
    fi
    parts=${IB_SM_PARTITIONS:-/etc/opensm/partitions.conf}
    if [ -n "${MOUNT_DIR:-}" ] && [ -s "$MOUNT_DIR/partitions.conf" ]; then
        mkdir -p "$(dirname "$parts")"
        if ! cmp -s "$MOUNT_DIR/partitions.conf" "$parts"; then
            cp "$MOUNT_DIR/partitions.conf" "$parts" && ib_info "partitions file from the context: $parts"
        fi
    fi
    ib_install_opensm || return 1
    local tool=${IB_SM_TOOL:-}
    if [ -z "$tool" ]; then
        # installed layout, then the source tree, then PATH
        for tool in "${IB_LIB_DIR:-.}/kvm-sriov-opensm" "${IB_LIB_DIR:-.}/../sm/kvm-sriov-opensm" \
            "$(command -v kvm-sriov-opensm 2>/dev/null)"; do
            [ -x "$tool" ] && break
        done
    fi
    [ -x "$tool" ] || { ib_error "kvm-sriov-opensm not found (reinstall the guest scripts)"; return 1; }
    IB_SM_PRIORITY=${IB_SM_PRIORITY:-14} IB_SM_PARTITIONS=$parts "$tool" start ||
        { ib_error "subnet manager did not start"; return 1; }
}
