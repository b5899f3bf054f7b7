"""The CUDA packing kernel's code run on the CPU (tests/cuda_emulation/),
tile by tile and thread by thread, against the host twin, byte for byte.
Needs nvcc (to compile the kernel's host-and-device code as host code), not
a GPU; the GPU itself is tested in test_packing_cuda.py."""
import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on this machine")
    exe = str(tmp_path_factory.mktemp("emulation") / "emulate_pack")
    subprocess.run(
        [nvcc, "-std=c++17", "-O2", "-Iinclude", "-Isrc",
         "tests/cuda_emulation/emulate_pack.cu", "src/pack.cpp",
         "src/host_ops.cpp", "-o", exe],
        cwd=REPO, check=True, timeout=600)
    return exe


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kernel_code_matches_host_twin(emulator, seed):
    cases = 200
    out = subprocess.run([emulator, str(cases), str(seed)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == f"emulate_pack: {cases} cases passed"
