#!/usr/bin/env bash
# Run a command under mpiexec on two emulated hosts of RANKS_PER_HOST ranks
# each (default 2): two network namespaces joined by a veth pair shaped
# with a token bucket (`tc ... tbf rate $RATE`, default 10gbit), so that
# MPICH sees two nodes (shared memory within each, libfabric's TCP provider
# between them) and every byte between the hosts crosses the shaped link.
#
#   bench/run_two_hosts.sh PROGRAM [ARGS...]      e.g. python bench/x.py
#
# PLACEMENT=cyclic puts the ranks on the hosts alternately (0, 2, ... on
# the first) instead of in blocks (the default, PLACEMENT=block).
#
# It needs root (or unprivileged user namespaces: `unshare -rn`). The
# first host is a private namespace of this script (`unshare --net`), the
# second one a namespace held by a `sleep` inside it; both go away with
# the command, and the machine's own interfaces are never touched. mpiexec
# starts each host's proxy through this script (`-launcher ssh
# -launcher-exec`: this script again), which enters the second host's namespace
# for it. The link's counters (bytes sent each way) are printed before and
# after, as lines "# link: <host> sent <bytes> bytes", and PROGRAM can read
# them itself at any moment with `bench/run_two_hosts.sh --sent`. The
# whole run is bounded by TIMEOUT seconds (default 300). MPIEXEC: the
# MPICH wheel's mpiexec (default .venv/bin/mpiexec).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
self="$here/bench/run_two_hosts.sh"
timeout_s=${TIMEOUT:-300}
rate=${RATE:-10gbit}
per_host=${RANKS_PER_HOST:-2}
mpiexec=${MPIEXEC:-$here/.venv/bin/mpiexec}
# block: ranks 0..n-1 on the first host, the next n on the second;
# cyclic: ranks alternate between the hosts (hydra's round robin).
placement=${PLACEMENT:-block}
first=10.77.0.1
second=10.77.0.2

# mpiexec's launcher (TWO_HOSTS_SECOND set, not --sent): called as hydra
# calls ssh, [options...] HOST COMMAND...; the command is one shell line,
# as a remote shell would read it.
if [[ -n ${TWO_HOSTS_SECOND:-} && ${1:-} != --sent ]]; then
    while [[ $1 == -* ]]; do shift; done
    host=$1
    shift
    if [[ $host == "$second" ]]; then
        exec nsenter --net="/proc/$TWO_HOSTS_SECOND/ns/net" -- sh -c "$*"
    fi
    exec sh -c "$*"
fi

case ${1:-} in
--sent)
    # Bytes the link's two ends have sent, first host's then second's.
    sent() { tc -s qdisc show dev hl0 | awk '/Sent/ {print $2; exit}'; }
    echo "$(sent) $(nsenter --net="/proc/$TWO_HOSTS_SECOND/ns/net" -- \
        bash -c "$(declare -f sent); sent")"
    exit 0
    ;;
--inside)
    shift
    ip link set lo up
    unshare --net -- sleep infinity </dev/null >/dev/null 2>&1 &
    second_ns=$!
    trap 'kill $second_ns 2>/dev/null' EXIT TERM INT
    sleep 0.2
    ip link add hl0 type veth peer name hl1
    ip link set hl1 netns "/proc/$second_ns/ns/net"
    in_second() { nsenter --net="/proc/$second_ns/ns/net" -- "$@"; }
    in_second ip link set hl1 name hl0
    in_second ip link set lo up
    ip addr add "$first/24" dev hl0
    in_second ip addr add "$second/24" dev hl0
    ip link set hl0 up
    in_second ip link set hl0 up
    tc qdisc add dev hl0 root tbf rate "$rate" burst 1mb latency 50ms
    in_second tc qdisc add dev hl0 root tbf rate "$rate" burst 1mb latency 50ms
    export TWO_HOSTS_SECOND=$second_ns
    export MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=hl0
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    echo "# link: $(bash "$self" --sent) bytes sent before"
    status=0
    slots=$per_host
    [[ $placement == cyclic ]] && slots=1
    "$mpiexec" -hosts "$first:$slots,$second:$slots" \
        -n $((2 * per_host)) -launcher ssh -launcher-exec "$self" \
        -localhost "$first" "$@" || status=$?
    echo "# link: $(bash "$self" --sent) bytes sent after"
    exit "$status"
    ;;
esac

if [[ $(id -u) == 0 ]]; then
    ns=(unshare --net)
else
    ns=(unshare --map-root-user --net)
fi
exec timeout --kill-after=10 "$timeout_s" "${ns[@]}" -- \
    bash "$self" --inside "$@"
