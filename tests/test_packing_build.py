"""The build of nncomm.packing: importable without nnabla and MPI, and with
its CUDA half compiled wherever nvcc is (as on the CI machine)."""
import os
import shutil
import subprocess
import sys

import pytest

import nncomm
from nncomm import packing


def test_packing_imports_without_nnabla_or_mpi():
    code = (
        "import sys\n"
        "for name in ('nnabla', 'mpi4py'):\n"
        "    sys.modules[name] = None  # any import of them now fails\n"
        "from nncomm import packing\n"
        "import numpy as np\n"
        "a = np.arange(4, dtype=np.float32)\n"
        "b = np.empty(4, dtype=np.float32)\n"
        "packing.pack([(a.ctypes.data, 'float32', 0, 4)], b.ctypes.data,\n"
        "             'float32', 2.0)\n"
        "assert (b == 2 * a).all()\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_cuda_compiled_where_nvcc_is():
    wanted = os.environ.get("NNCOMM_CUDA", "").strip().lower()
    if wanted in ("0", "off", "no", "false"):
        pytest.skip("NNCOMM_CUDA=0: built without CUDA on purpose")
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        pytest.skip("no nvcc on this machine")
    assert packing.cuda_built, \
        "nvcc is on PATH but nncomm.packing was built without CUDA"


def test_cuda_packer_error_is_clear_without_a_gpu():
    try:
        packing.CudaPacker()
    except RuntimeError as e:
        assert "CUDA" in str(e) or "cuda" in str(e)
    else:
        pytest.skip("a CUDA device is present")


def test_lazy_names():
    assert set(nncomm.__all__) <= set(dir(nncomm))
    with pytest.raises(AttributeError, match="no attribute"):
        nncomm.no_such_name


def test_cpu_only_build_without_mpi(tmp_path):
    """NNCOMM_CUDA=0 NNCOMM_MPI=0: the packing and quantization modules
    alone, no nvcc, no MPI (what a machine without either builds); the
    CudaPacker says why it has no kernels."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = subprocess.run(["git", "ls-files", "setup.py", "pyx", "src",
                            "include", "python"], cwd=repo, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in files:
        os.makedirs(tmp_path / os.path.dirname(name), exist_ok=True)
        shutil.copy(os.path.join(repo, name), tmp_path / name)
    env = dict(os.environ, NNCOMM_CUDA="0", NNCOMM_MPI="0")
    build = subprocess.run([sys.executable, "setup.py", "build_ext",
                            "--inplace"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    assert "nvcc" not in build.stdout
    built = os.listdir(tmp_path / "python" / "nncomm")
    for module in ("packing.", "_quantize.", "_low_rank."):
        assert any(n.startswith(module) and n.endswith(".so")
                   for n in built), built
    assert not any(n.startswith("_nncomm.") for n in built), built
    code = (
        "import sys\n"
        "for name in ('nnabla', 'mpi4py'):\n"
        "    sys.modules[name] = None\n"
        "from nncomm import _low_rank, _quantize, packing\n"
        "assert _quantize.matrix((3, 4, 5)) == (3, 20)\n"
        "assert callable(_low_rank.project)\n"
        "assert not packing.cuda_built\n"
        "try:\n"
        "    packing.CudaPacker()\n"
        "except RuntimeError as e:\n"
        "    assert 'built without CUDA' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('CudaPacker without kernels')\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code],
                         cwd=tmp_path / "python", capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
