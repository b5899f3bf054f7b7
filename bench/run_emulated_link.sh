#!/usr/bin/env bash
# Run bench/callback_bench.py (or another script) on 2 ranks that talk over an
# emulated 10 Gbit/s link instead of shared memory.
#
#   bench/run_emulated_link.sh [callback_bench.py options...]
#   BENCH=/tmp/other.py bench/run_emulated_link.sh [its options...]
#
# It needs root (or unprivileged user namespaces: it falls back to
# `unshare -rn`). Inside a private network namespace of its own, so that the
# host's interfaces are never touched, it brings the loopback up, shapes it
# with a token bucket (`tc ... tbf rate 10gbit burst 1mb latency 50ms`) and
# makes MPICH send everything, even between ranks on one host, through
# libfabric's TCP provider on that loopback:
#
#   MPIR_CVAR_NOLOCAL=1        no shared-memory path between local ranks
#   MPIR_CVAR_CH4_NETMOD=ofi   the libfabric netmod (the wheel also has ucx)
#   FI_PROVIDER=tcp            libfabric's sockets provider
#   FI_TCP_IFACE=lo, -iface lo the shaped interface, for data and for hydra
#
# It prints the qdisc's counters before and after, so that one can see the
# traffic went through the shaper. The whole run is bounded by TIMEOUT
# seconds (default 300). The namespace disappears with the command.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
bench=${BENCH:-$here/bench/callback_bench.py}
timeout_s=${TIMEOUT:-300}
rate=${RATE:-10gbit}

if [[ ${1:-} == --inside ]]; then
    shift
    ip link set lo up
    tc qdisc add dev lo root tbf rate "$rate" burst 1mb latency 50ms
    echo "# netns: lo shaped: $(tc qdisc show dev lo)"
    export MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp \
           FI_TCP_IFACE=lo
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    status=0
    "$here/.venv/bin/mpiexec" -n 2 -iface lo \
        "$here/.venv/bin/python" "$bench" "$@" || status=$?
    echo "# netns: lo counters: $(tc -s qdisc show dev lo | sed -n 2p)"
    exit "$status"
fi

if [[ $(id -u) == 0 ]]; then
    ns=(unshare --net)
else
    ns=(unshare --map-root-user --net)
fi
exec timeout --kill-after=10 "$timeout_s" "${ns[@]}" -- \
    bash "$here/bench/run_emulated_link.sh" --inside "$@"
