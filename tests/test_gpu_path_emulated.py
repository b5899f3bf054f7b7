"""The GPU path's host code over real MPI on 2-4 ranks, on the device
memory of the CPU-side CUDA runtime (tests/cuda_emulation/fake_cudart.cpp),
whose streams run work late and in random legal orders:

- the host-staged transport, the CUDA IPC transport (the ranks' processes
  map each other's fake device memory) and the NCCL transport (on a fake
  NCCL whose collectives run as MPI ones when their turn on the stream
  comes): every
  collective against a reference, with inputs still being written on the
  compute stream when it starts and results read there after it, then the
  list collectives on device memory (fused messages packed by the CUDA
  packer's kernel, emulated; zeroing arrays) (transports_over_mpi.cpp);
- the device group's choice of transport (NNCOMM_GPU_TRANSPORT, NCCL
  loaded from NNCOMM_NCCL_LIBRARY: the fake NCCL built as a library) and
  its collectives, ordered with the compute stream;
- the callback engine with the CUDA runner on it: gradients "computed" on
  the compute stream in a random order per rank, packed by the CUDA
  packer's kernel (emulated), reduced, unpacked, and read on the compute
  stream after finish(), on either transport; with the NaN/infinity check,
  one rank's NaN reported on every rank (engine_over_mpi.cpp);
- a set-up step of either transport, the device group or its engine
  failing on one rank: every rank fails at once, naming it
  (transports_over_mpi.cpp: check_setup_failure);
- a rank whose script ends before an NCCL all-reduce: the others' wait
  fails within seconds, naming it (check_ended_rank).

Needs nvcc (to compile against the CUDA headers), not a GPU."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from launcher import run_program

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The PyPI mpich wheel's headers and library, beside the interpreter.
MPI_PREFIX = os.path.dirname(os.path.dirname(sys.executable))
EMULATION = "tests/cuda_emulation/"
# What both programs link: the transports, the waits and the fake runtime.
COMMON = [EMULATION + "fake_cudart.cpp", EMULATION + "fake_nccl.cpp",
          "src/transports/cuda_staged_transport.cu",
          "src/transports/cuda_ipc_transport.cu",
          "src/transports/cuda_device_transport.cu",
          "src/transports/cuda_nccl_transport.cu",
          "src/transports/nccl_api.cpp", "src/transports/mpi_transport.cpp",
          "src/transports/transport.cpp", "src/transports/join.cpp",
          "src/transports/ended_ranks.cpp",
          "src/transports/hierarchical_allreduce.cpp",
          "src/transports/host_layout.cpp",
          "src/observability/stall_inspector.cpp",
          "src/observability/flight_recorder.cpp",
          "src/observability/config.cpp", "src/observability/timeline.cpp",
          "src/core/wait.cpp", "src/core/broken_process.cpp",
          "src/host/elementwise.cpp", "src/host/huge_pages.cpp"]


# The list collectives' arrays of 4 KiB or more go direct, the others fused.
LISTS = {"NNCOMM_DIRECT_BYTES": "4096"}


def nvcc():
    found = shutil.which("nvcc")
    if found is None:
        pytest.skip("no nvcc on this machine")
    return found


def build(tmp_path_factory, name, sources):
    exe = str(tmp_path_factory.mktemp("gpu_path") / name)
    lib = os.path.join(MPI_PREFIX, "lib")
    # The packer's device code is compiled (for one architecture) but run
    # by the fake, tile by tile. Exported, the fake runtime's functions serve
    # the fake NCCL library too.
    subprocess.run(
        [nvcc(), "-std=c++17", "-O1", "-cudart", "none", "-arch=sm_80",
         "-Iinclude", "-Isrc", "-I" + EMULATION,
         "-I" + os.path.join(MPI_PREFIX, "include"),
         EMULATION + name + ".cpp"] + sources + COMMON +
        ["-L" + lib, "-lmpi", "-ldl", "-Xlinker", "-rpath=" + lib,
         "-Xlinker", "-export-dynamic", "-o", exe],
        cwd=REPO, check=True, timeout=600)
    return exe


@pytest.fixture(scope="module")
def fake_libnccl(tmp_path_factory):
    library = str(tmp_path_factory.mktemp("nccl") / "libfakenccl.so")
    lib = os.path.join(MPI_PREFIX, "lib")
    subprocess.run(
        [nvcc(), "-std=c++17", "-O1", "-shared", "-Xcompiler", "-fPIC",
         "-Iinclude", "-I" + EMULATION,
         "-I" + os.path.join(MPI_PREFIX, "include"),
         EMULATION + "fake_nccl.cpp", "-L" + lib, "-lmpi", "-o", library],
        cwd=REPO, check=True, timeout=600)
    return library


@pytest.fixture(scope="module")
def transports_over_mpi(tmp_path_factory):
    return build(tmp_path_factory, "transports_over_mpi",
                 ["src/collectives/list_collectives.cpp",
                  "src/collectives/group.cpp",
                  "src/collectives/collective_queue.cpp",
                  "src/cuda/cuda_device_arrays.cu", "src/cuda/cuda_pack.cu",
                  "src/cuda/cuda_device_path.cu", "src/cuda/cuda_devices.cu",
                  "src/cuda/cuda_runner.cu", "src/cuda/device_trace.cu",
                  "src/core/bucket_plan.cpp",
                  "src/core/pack.cpp", "src/core/fusion_buffer.cpp",
                  "src/core/array_memory.cpp", "src/core/engine.cpp",
                  "src/core/bucket_runner.cpp", "src/core/launch_tuner.cpp"])


@pytest.fixture(scope="module")
def engine_over_mpi(tmp_path_factory):
    return build(tmp_path_factory, "engine_over_mpi",
                 ["src/core/engine.cpp", "src/core/bucket_runner.cpp",
                  "src/cuda/cuda_runner.cu", "src/cuda/device_trace.cu",
                  "src/cuda/cuda_device_arrays.cu",
                  "src/cuda/cuda_pack.cu", "src/core/launch_tuner.cpp",
                  "src/core/bucket_plan.cpp", "src/core/pack.cpp"])


def run(program, ranks, args, env=None, timeout=300):
    code, out, err, _ = run_program([program, *args], ranks, env=env,
                                    timeout=timeout)
    assert code == 0, out + err
    assert f"checks passed on {ranks} ranks" in out, out + err
    return out


@pytest.mark.parametrize("ranks,seed", [(2, 1), (3, 2), (4, 3), (2, 4)])
def test_staged_collectives_on_emulated_devices(transports_over_mpi, ranks,
                                                seed):
    # Small MPI pieces, so the larger arrays travel in several.
    run(transports_over_mpi, ranks, [seed, "staged"],
        dict(LISTS, NNCOMM_CHUNK_BYTES="65536"))


# Ranks mapping each other's fake device memory; chunks of 4 KiB, so the
# larger arrays go through both slots many times (a slot rewritten before
# every rank's reads of it completed shows up as wrong data). Operations
# under 1 KiB through host memory, in between the others, or none.
@pytest.mark.parametrize("ranks,seed,least", [(2, 1, "1024"), (3, 2, "0"),
                                              (4, 3, "1024")])
def test_ipc_collectives_on_emulated_devices(transports_over_mpi, ranks,
                                             seed, least):
    run(transports_over_mpi, ranks, [seed, "ipc"],
        dict(LISTS, NNCOMM_IPC_CHUNK_BYTES="4096",
             NNCOMM_IPC_MIN_BYTES=least))


# Powers of two: NCCL folds the scale and the division into one factor,
# exact for these only.
@pytest.mark.parametrize("ranks,seed", [(2, 1), (4, 2)])
def test_nccl_collectives_on_emulated_devices(transports_over_mpi, ranks,
                                              seed):
    run(transports_over_mpi, ranks, [seed, "nccl"], LISTS)


# The fake devices: rank r on device r % 2, so 3 ranks share one.
@pytest.mark.parametrize("ranks,setting,library,chosen", [
    (2, "auto", True, "nccl"),
    (3, "auto", True, "mpi"),    # ranks 0 and 2 share a device
    (2, "auto", False, "mpi"),   # no NCCL to load
    (2, "mpi", True, "mpi"),
    (2, "nccl", True, "nccl"),
    (3, "ipc", True, "ipc"),
])
def test_device_path_chooses_its_transport(transports_over_mpi, fake_libnccl,
                                           ranks, setting, library, chosen):
    env = {"NNCOMM_GPU_TRANSPORT": setting,
           "NNCOMM_NCCL_LIBRARY": fake_libnccl if library else
           "no_such_libnccl.so.2"}
    out = run(transports_over_mpi, ranks, [1, "group"], env)
    assert f"(group: {chosen})" in out, out
    # Ranks spread over both fake GPUs as well as they can be: no advice
    # (tests/mpi/gpu_arrays.py emulated puts a group on one).
    assert "advice" not in out, out


# Every rank on fake device 0: auto takes CUDA IPC; where mapping the
# others' memory fails on one rank, every rank falls back to host memory
# together, and rank 0 says why.
@pytest.mark.parametrize("fail,chosen", [(None, "ipc"),
                                         ("cudaIpcOpenMemHandle", "mpi")])
def test_auto_takes_ipc_on_one_device_or_falls_back(
        transports_over_mpi, fake_libnccl, fail, chosen):
    env = {"NNCOMM_GPU_TRANSPORT": "auto", "TRANSPORTS_ONE_DEVICE": "1",
           "NNCOMM_NCCL_LIBRARY": fake_libnccl}
    if fail:
        env["TRANSPORTS_FAIL_CALL"] = fail
    out = run(transports_over_mpi, 2, [1, "group"], env)
    assert f"(group: {chosen})" in out, out
    assert ("CUDA IPC could not be set up" in out) == bool(fail), out


@pytest.mark.parametrize("ranks,library,reason", [
    (2, False, "NCCL could not be loaded (no_such_libnccl.so.2"),
    (3, True, "ranks of this group share a GPU, which NCCL refuses"),
])
def test_device_path_refuses_nccl_it_cannot_use(
        transports_over_mpi, fake_libnccl, ranks, library, reason):
    env = {"NNCOMM_GPU_TRANSPORT": "nccl",
           "NNCOMM_NCCL_LIBRARY": fake_libnccl if library else
           "no_such_libnccl.so.2"}
    code, out, err, _ = run_program([transports_over_mpi, 1, "group"], ranks,
                                    env=env, timeout=300)
    assert code != 0, out
    # The ranks say why (the first to fail may abort the others first).
    assert "Group::all_reduce on the device: " in out and reason in out, \
        out + err


@pytest.mark.parametrize("launch", ["eager", "deferred"])
@pytest.mark.parametrize("ranks,seed", [(2, 1), (3, 2), (4, 3)])
def test_engine_on_emulated_devices(engine_over_mpi, ranks, seed, launch):
    run(engine_over_mpi, ranks, [seed], {"NNCOMM_LAUNCH": launch})


# Two ranks on the two fake GPUs (NCCL refuses ranks sharing one), a
# power of two (NCCL's folded scale is exact for these only).
@pytest.mark.parametrize("seed", [1, 2])
def test_engine_on_emulated_nccl(engine_over_mpi, seed):
    run(engine_over_mpi, 2, [seed, "nccl"])


def test_a_rank_whose_script_ends_fails_the_nccl_wait_for_it(
        transports_over_mpi):
    # NCCL says nothing of a rank that never comes: the end notices do.
    # Rank 1 makes one all-reduce of rank 0's two, then ends; rank 0's wait
    # fails at its first look (after a second), not at NNCOMM_TIMEOUT, and
    # aborts the job.
    code, out, err, _ = run_program([transports_over_mpi, "1", "ended"], 2,
                                    env={"NNCOMM_TIMEOUT": "60"},
                                    timeout=60)
    line = re.search(r"^rank 0 failed after ([\d.]+) s: (.*)$", out,
                     re.MULTILINE)
    assert line and code != 0, out + err
    assert float(line.group(1)) < 10, out
    assert line.group(2) == (
        "an operation (NCCL operation 2 on device 0, world ranks [0, 1]) "
        "cannot complete: the script of world ranks [1] ended without "
        "making this call (fewer batches than the others? comm.join() lets "
        "ranks with uneven data train together)"), out


# A set-up step failing on one rank (a fake runtime call, or the fake
# NCCL's through NNCOMM_FAKE_NCCL_FAIL), before or inside the collective
# part of the set-up: the failing rank gives its own error, every other
# rank one naming it and its error, all within seconds. The program fails
# past 5 s, so a rank left waiting until NNCOMM_TIMEOUT (10 s) fails the
# test, and one left inside the fake ncclCommInitRank (no timeout) is
# killed at a minute.
INJECTED = {"nccl": "unhandled system error (injected)",
            "cuda": "out of memory"}


@pytest.mark.parametrize(
    "ranks,what,transport,call,after,failing,step", [
        (2, "nccl", None, "ncclGetUniqueId", 0, 0, "setting up NCCL"),
        (3, "nccl", None, "cudaStreamCreateWithFlags", 0, 2,
         "setting up NCCL"),
        (2, "nccl", None, "ncclCommInitRank", 0, 1,
         "creating the NCCL communicator"),
        (3, "nccl", None, "ncclCommInitRank", 0, 0,
         "creating the NCCL communicator"),
        (3, "group", "mpi", "cudaEventCreateWithFlags", 0, 1,
         "setting up GPU communication through host memory"),
        (2, "group", "mpi", "cudaEventCreateWithFlags", 1, 0,
         "setting up the group's GPU packer"),
        (2, "group", "nccl", "ncclCommInitRank", 0, 1,
         "creating the NCCL communicator"),
        (3, "group", "ipc", "cudaIpcOpenMemHandle", 0, 2,
         "mapping the other ranks' device memory (CUDA IPC; ranks on one "
         "host whose GPUs can reach each other's memory)"),
        (2, "engine", "mpi", "cudaEventCreateWithFlags", 1, 1,
         "setting up the engine's GPU packer"),
    ])
def test_a_set_up_failing_on_one_rank_fails_on_every_rank(
        transports_over_mpi, fake_libnccl, ranks, what, transport, call,
        after, failing, step):
    env = {"NNCOMM_TIMEOUT": "10", "NNCOMM_NCCL_LIBRARY": fake_libnccl}
    if transport is not None:
        env["NNCOMM_GPU_TRANSPORT"] = transport
    out = run(transports_over_mpi, ranks,
              [1, "fail", what, call, failing, after], env, timeout=60)
    cause = call + " failed: " + INJECTED[call[:4]]
    for r in range(ranks):
        line = re.search(rf"^rank {r} failed after [\d.]+ s: (.*)$", out,
                         re.MULTILINE)
        assert line, out
        want = cause if r == failing else \
            f"group rank {failing} failed {step}: {cause}"
        assert line.group(1) == want, out
