"""The Python layer's GPU path where there is no GPU: nncomm built over the
fake CUDA runtime of tests/cuda_emulation (setup.py's NNCOMM_FAKE_CUDA=1,
into a directory of its own), driven through __cuda_array_interface__
arrays in the fake's device memory (tests/mpi/fake_device.py) on 1-4 ranks
over real MPI, against numpy: every collective, gradient_reducer against
all_reduce bitwise, the wire dtypes, float64 and arrays on the wrong
device. The fake runs device work late in random legal orders, so a
missing stream order gives wrong values. The host-staged transport and
CUDA IPC (the ranks mapping each other's fake device memory) run here (no
NCCL is loaded); NCCL's host logic is tested by
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


@pytest.mark.parametrize("n,transport", [(n, "mpi") for n in RANK_COUNTS]
                         + [(2, "ipc"), (3, "ipc")])
def test_collectives_and_engine_through_python(fake_cuda_package, n,
                                               transport):
    # IPC takes operations of 4 KiB or more, host memory the others.
    out = run_worker("gpu_arrays", n, ["emulated"], timeout=600, env={
        "PYTHONPATH": os.pathsep.join([fake_cuda_package, WORKERS]),
        "NNCOMM_GPU_TRANSPORT": transport, "NNCOMM_IPC_MIN_BYTES": "4096"})
    assert f"checks passed on {n} ranks" in out


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
