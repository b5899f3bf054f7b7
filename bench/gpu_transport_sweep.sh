#!/usr/bin/env bash
# Ranks sharing one GPU: the host-staged transport against CUDA IPC, and
# IPC's sensitivity to how many operations a step makes (each costs a
# round between the two processes' GPU contexts, whatever its size), on
# the same machine in one run:
#
# - gpu_engine_bench.py's all-reduce of one array of each of MIBS MiB
#   ("1 2 4 8 16 100") on each transport (the per-operation cost, and the
#   bandwidth);
# - gpu_torch_bench.py (ResNet-50, 2 ranks) on IPC with buckets of each of
#   BUCKETS MiB ("2 8 25"; DDP's default bucket_cap_mb is 25).
#
#   bench/gpu_transport_sweep.sh      # after .ci/gpu_checks tests built it
#   BUCKETS= bench/gpu_transport_sweep.sh     # the all-reduces only
#
# PYTHON: the interpreter (.gpu-venv/bin/python, as .ci/gpu_checks makes);
# MPIEXEC beside it. Summaries only; the logs go to LOGS (gpu-out/sweep).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.gpu-venv/bin/python}
MPIEXEC=${MPIEXEC:-$(dirname "$PYTHON")/mpiexec}
LOGS=${LOGS:-gpu-out/sweep}
MIBS=${MIBS-"1 2 4 8 16 100"}
BUCKETS=${BUCKETS-"2 8 25"}
mkdir -p "$LOGS"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1

for transport in mpi ipc; do
  for mib in $MIBS; do
    log=$LOGS/all_reduce_${transport}_${mib}.log
    NNCOMM_GPU_TRANSPORT=$transport "$MPIEXEC" -n 2 "$PYTHON" \
      bench/gpu_engine_bench.py --gemms 1 --iters 10 --warmup 2 --mib "$mib" \
      > "$log" 2>&1
    echo "$transport, all_reduce of $mib MiB:"
    grep -E '^  (by hand|nncomm) ' "$log"
  done
done
for mib in $BUCKETS; do
  log=$LOGS/torch_ipc_${mib}.log
  NNCOMM_GPU_TRANSPORT=ipc "$MPIEXEC" -n 2 "$PYTHON" bench/gpu_torch_bench.py \
    --pack-size $((mib << 20)) > "$log" 2>&1
  echo "ipc, ResNet-50, buckets of $mib MiB:"
  grep -E '^  (forward|compute|comm|serial|nncomm|ddp) |nncomm / |checks:' \
    "$log"
done
