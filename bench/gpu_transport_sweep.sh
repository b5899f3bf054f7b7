#!/usr/bin/env bash
# Ranks sharing one GPU: the host-staged transport against CUDA IPC, and
# IPC's sensitivity to how many operations a step makes (each costs a
# round between the two processes' GPU contexts, whatever its size), on
# the same machine in one run:
#
# - gpu_engine_bench.py's all-reduce of one array, 1 MiB and 100 MiB, on
#   each transport (the per-operation cost, and the bandwidth);
# - gpu_torch_bench.py (ResNet-50, 2 ranks) on IPC with buckets of 2, 8 and
#   25 MiB (DDP's default bucket_cap_mb is 25).
#
#   bench/gpu_transport_sweep.sh      # after .ci/gpu_checks tests built it
#
# PYTHON: the interpreter (.gpu-venv/bin/python, as .ci/gpu_checks makes);
# MPIEXEC beside it. Summaries only; the logs go to LOGS (gpu-out/sweep).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.gpu-venv/bin/python}
MPIEXEC=${MPIEXEC:-$(dirname "$PYTHON")/mpiexec}
LOGS=${LOGS:-gpu-out/sweep}
mkdir -p "$LOGS"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1

for transport in mpi ipc; do
  for mib in 1 100; do
    log=$LOGS/all_reduce_${transport}_${mib}.log
    NNCOMM_GPU_TRANSPORT=$transport "$MPIEXEC" -n 2 "$PYTHON" \
      bench/gpu_engine_bench.py --gemms 1 --iters 20 --mib "$mib" > "$log" 2>&1
    echo "$transport, all_reduce of $mib MiB:"
    grep -E '^  (by hand|nncomm) ' "$log"
  done
done
for mib in 2 8 25; do
  log=$LOGS/torch_ipc_${mib}.log
  NNCOMM_GPU_TRANSPORT=ipc "$MPIEXEC" -n 2 "$PYTHON" bench/gpu_torch_bench.py \
    --pack-size $((mib << 20)) > "$log" 2>&1
  echo "ipc, ResNet-50, buckets of $mib MiB:"
  grep -E '^  (forward|compute|comm|serial|nncomm|ddp) |nncomm / |checks:' \
    "$log"
done
