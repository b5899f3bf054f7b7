"""The Python layer's GPU path where there is no GPU: nncomm built over the
fake CUDA runtime of tests/cuda_emulation (setup.py's NNCOMM_FAKE_CUDA=1,
into a directory of its own), driven through __cuda_array_interface__
arrays in the fake's device memory (tests/mpi/fake_device.py) on 1-4 ranks
over real MPI, against numpy: every collective, gradient_reducer against
all_reduce bitwise, the wire dtypes, float64 and arrays on the wrong
device. The fake runs device work late in random legal orders, so a
missing stream order gives wrong values. The host-staged transport, CUDA
IPC (the ranks mapping each other's fake device memory) and NCCL (the fake
NCCL of tests/cuda_emulation, whose collectives run as MPI ones on the
fake's streams, built as a library that the build's fake runtime serves)
run here; NCCL's host logic is tested further by
test_gpu_path_emulated.py."""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from launcher import RANK_COUNTS, WORKERS, run_job, run_worker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def fake_cuda_package(tmp_path_factory):
    """A directory holding the nncomm package, its compiled modules built
    over the fake runtime."""
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc on this machine")
    out = tmp_path_factory.mktemp("fake_cuda")
    lib = out / "lib"
    env = dict(os.environ, NNCOMM_FAKE_CUDA="1", NNCOMM_CUDA="1",
               NNCOMM_CUDA_ARCH="80")
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext",
                    "--build-lib", str(lib), "--build-temp",
                    str(out / "temp"), "-j", "2"],
                   cwd=REPO, env=env, check=True, timeout=1800,
                   stdout=subprocess.DEVNULL)
    # The Python modules and subpackages beside the modules built.
    for entry in glob.glob(os.path.join(REPO, "python", "nncomm", "*")):
        if entry.endswith(".py") or os.path.isfile(
                os.path.join(entry, "__init__.py")):
            os.symlink(entry, lib / "nncomm" / os.path.basename(entry))
    return str(lib)


@pytest.fixture(scope="module")
def fake_nccl_library(fake_cuda_package, tmp_path_factory):
    """The fake NCCL as a library for nncomm's loader, linked to the
    package's extension, whose fake runtime runs its collectives."""
    library = str(tmp_path_factory.mktemp("nccl") / "libfakenccl.so")
    extension, = glob.glob(os.path.join(fake_cuda_package, "nncomm",
                                        "_nncomm.*.so"))
    prefix = os.path.dirname(os.path.dirname(sys.executable))
    subprocess.run(
        ["nvcc", "-std=c++17", "-O1", "-shared", "-Xcompiler", "-fPIC",
         "-Iinclude", "-Itests/cuda_emulation",
         "-I" + os.path.join(prefix, "include"),
         "tests/cuda_emulation/fake_nccl.cpp", extension,
         "-L" + os.path.join(prefix, "lib"), "-lmpi", "-Xlinker",
         "-rpath=" + os.path.dirname(extension), "-o", library],
        cwd=REPO, check=True, timeout=600)
    return library


# On 3 ranks over IPC the engine's plans stay as drafted (direct buckets
# included); on 2 its buckets are merged up to 32 MiB, the default.
@pytest.mark.parametrize("n,transport,floor", [
    (n, "mpi", None) for n in RANK_COUNTS] + [
    (2, "ipc", None), (3, "ipc", "0"), (2, "nccl", None)])
def test_collectives_and_engine_through_python(fake_cuda_package,
                                               fake_nccl_library, n,
                                               transport, floor):
    # IPC takes operations of 4 KiB or more, host memory the others.
    env = {"PYTHONPATH": os.pathsep.join([fake_cuda_package, WORKERS]),
           "NNCOMM_GPU_TRANSPORT": transport, "NNCOMM_IPC_MIN_BYTES": "4096",
           "NNCOMM_NCCL_LIBRARY": fake_nccl_library}
    if floor is not None:
        env["NNCOMM_IPC_BUCKET_BYTES"] = floor
    out = run_worker("gpu_arrays", n, ["emulated"], timeout=600, env=env)
    assert f"checks passed on {n} ranks" in out


def test_a_rank_whose_script_ends_fails_the_nccl_wait_for_it(
        fake_cuda_package, fake_nccl_library):
    # NCCL tells nothing of a rank that never comes; the end notices do,
    # at the wait's first look, and the job is then aborted.
    code, out, err, _ = run_job("gpu_arrays", 2, ["one_rank_ended"],
                                timeout=120, env={
        "PYTHONPATH": os.pathsep.join([fake_cuda_package, WORKERS]),
        "NNCOMM_GPU_TRANSPORT": "nccl", "NNCOMM_TIMEOUT": "100",
        "NNCOMM_NCCL_LIBRARY": fake_nccl_library})
    line = re.search(r"^rank 0 raised after ([\d.]+) s: (.*)$", out,
                     re.MULTILINE)
    assert line and code != 0, out + err
    assert float(line.group(1)) < 30, out
    assert line.group(2).startswith(
        "CommunicatorError: all_reduce of 1 arrays (NCCL operation "), out
    assert "world ranks [0, 1]) cannot complete: the script of world ranks " \
        "[1] ended without making this call" in line.group(2), out


@pytest.mark.parametrize("n", [2, 3])
def test_a_refusal_on_one_rank_ends_the_call_on_every_rank(
        fake_cuda_package, n):
    # Rank 0 refuses an array on the wrong device; the others, already in
    # the all_reduce, raise within seconds (their wait's next look) rather
    # than at NNCOMM_TIMEOUT. The communicator is then broken: the job
    # ends at exit.
    _, out, err, _ = run_job("gpu_arrays", n, ["one_rank_refused"],
                             timeout=120, env={
        "PYTHONPATH": os.pathsep.join([fake_cuda_package, WORKERS]),
        "NNCOMM_GPU_TRANSPORT": "mpi", "NNCOMM_TIMEOUT": "100"})
    # mpiexec may join two ranks' lines.
    found = re.findall(r"rank (\d+) raised after ([\d.]+) s: "
                       r"(.*?)(?=rank \d+ raised after|$)", out, re.MULTILINE)
    raised = {int(rank): message for rank, _, message in found}
    assert sorted(raised) == list(range(n)), out + err
    assert "is on CUDA device 1" in raised[0], raised
    for r in range(1, n):
        assert "make different calls" in raised[r], raised
    assert all(float(seconds) < 30 for _, seconds, _ in found), out
