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
