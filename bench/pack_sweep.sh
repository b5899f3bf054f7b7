#!/usr/bin/env bash
# Tunes the CUDA packing kernel on this GPU: builds nncomm.packing once per
# tile size and batch (NNCOMM_PACK_TILE_BYTES, NNCOMM_PACK_BATCH: the bytes
# of a row's wider side one block moves, and the 16-byte words a thread
# loads before storing), side by side, then runs bench/pack_bench.py on
# each in turn and prints their summaries one under the other.
#
#   bench/pack_sweep.sh [pack_bench.py arguments]
#   TILES="32768 65536" BATCHES="2 4" bench/pack_sweep.sh --iters 10
#
# PYTHON names an interpreter with CuPy, Cython and setuptools (python3);
# nvcc must be on PATH or under CUDA_HOME. Each variant is built in a copy
# of the sources under WORK (/tmp/nncomm-pack-sweep), its log beside it.
# The defaults are what the kernel ships with; pick new ones from the
# table, in every case at once, and record the sweep in
# docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
case $PYTHON in  # the builds run elsewhere: a relative path made absolute
  */*) PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON") ;;
esac
TILES=${TILES:-"32768 65536 131072"}
BATCHES=${BATCHES:-"2 4"}
WORK=${WORK:-/tmp/nncomm-pack-sweep}
if ! command -v nvcc >/dev/null; then
  export PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH
fi
arch=$( (nvidia-smi --query-gpu=compute_cap --format=csv,noheader \
         2>/dev/null || true) | head -1 | tr -d '. ')

variants=()
for tile in $TILES; do
  for batch in $BATCHES; do
    variants+=("tile$tile-batch$batch")
    dir=$WORK/tile$tile-batch$batch
    rm -rf "$dir"
    mkdir -p "$dir"
    cp -r setup.py include src pyx "$dir"
    mkdir -p "$dir/python"
    cp -r python/nncomm "$dir/python"
    rm -f "$dir"/python/nncomm/*.so
    flags="-DNNCOMM_PACK_TILE_BYTES=$tile -DNNCOMM_PACK_BATCH=$batch"
    (cd "$dir" && CFLAGS="$flags" NVCC_APPEND_FLAGS="$flags" NNCOMM_MPI=0 \
       NNCOMM_CUDA=1 NNCOMM_CUDA_ARCH=${arch:-90} \
       "$PYTHON" setup.py -q build_ext --inplace > build.log 2>&1 ||
       { echo "pack_sweep: $dir failed to build:"; tail -20 build.log; }) &
  done
done
wait

for v in "${variants[@]}"; do
  dir=$WORK/$v
  echo "== $v"
  PYTHONPATH=$dir/python "$PYTHON" bench/pack_bench.py "$@" \
    > "$dir/bench.log" 2>&1 || echo "pack_sweep: $v: pack_bench failed"
  grep -E '^# packer' "$dir/bench.log" || true
done

echo
echo "# pack_sweep: the summaries of bench/pack_bench.py $*"
for v in "${variants[@]}"; do
  echo "== $v"
  sed -n '/^# summary/,$p' "$WORK/$v/bench.log" | tail -n +2
done
