"""nncomm's communicator built without CUDA (NNCOMM_CUDA=0, as where no
nvcc is): it builds and links, and refuses every collective placed on a
device in one place (src/cuda/cuda_device_path_unavailable.cpp), saying why, on
every rank (tests/mpi/without_cuda.py)."""
import glob
import os
import subprocess
import sys

import pytest

from launcher import WORKERS, run_worker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def package_without_cuda(tmp_path_factory):
    out = tmp_path_factory.mktemp("without_cuda")
    lib = out / "lib"
    env = dict(os.environ, NNCOMM_CUDA="0")
    build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext",
                            "--build-lib", str(lib), "--build-temp",
                            str(out / "temp"), "-j", "2"],
                           cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=1800)
    assert build.returncode == 0, build.stderr[-3000:]
    assert "nvcc" not in build.stdout
    # The Python modules and subpackages beside the modules built.
    for entry in glob.glob(os.path.join(REPO, "python", "nncomm", "*")):
        if entry.endswith(".py") or os.path.isfile(
                os.path.join(entry, "__init__.py")):
            os.symlink(entry, lib / "nncomm" / os.path.basename(entry))
    return str(lib)


@pytest.mark.parametrize("n", [1, 2])
def test_device_placements_refused(package_without_cuda, n):
    out = run_worker("without_cuda", n, env={
        "PYTHONPATH": os.pathsep.join([package_without_cuda, WORKERS])})
    assert f"checks passed on {n} ranks" in out
