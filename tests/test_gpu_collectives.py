"""Every collective on CuPy arrays, against numpy, and gradient_reducer with
a CuPy "backward" against a plain all_reduce, bitwise: NCCL on 1 rank, and
on 2 and 3 ranks sharing the GPU (NCCL refuses them) the host-staged MPI
transport and CUDA IPC.
Needs a CUDA GPU, CuPy and a build with nvcc; skipped otherwise (the same
paths run on emulated devices in test_gpu_path_emulated.py)."""
import pytest

from launcher import run_worker

pytestmark = pytest.mark.gpu

cupy = pytest.importorskip("cupy")
try:
    _DEVICES = cupy.cuda.runtime.getDeviceCount()
except cupy.cuda.runtime.CUDARuntimeError:
    _DEVICES = 0
if _DEVICES == 0:
    pytest.skip("no CUDA device", allow_module_level=True)


# IPC: every operation through it (least 0), or the small ones staged.
@pytest.mark.parametrize("n,transport,least", [
    (1, "nccl", None), (2, "mpi", None), (2, "ipc", "0"), (3, "ipc", None)])
def test_collectives_on_cupy_arrays(n, transport, least):
    env = {"NNCOMM_GPU_TRANSPORT": transport}
    if least is not None:
        env["NNCOMM_IPC_MIN_BYTES"] = least
    out = run_worker("gpu_arrays", n, ["cupy"], env=env)
    assert "checks passed" in out
