"""The CUDA packing code run on the CPU, where there is no GPU
(tests/cuda_emulation/): the kernel's tile code, tile by tile and thread by
thread, against the host twin byte for byte; and the packer's host code
(src/cuda/cuda_pack.cu: table slots, uploads, event waits, launch arguments,
error paths) on a CPU-side CUDA runtime whose streams run work late and in
random legal orders. Needs nvcc (to compile the CUDA sources), not a GPU;
the GPU itself is tested in test_packing_cuda.py."""
import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMULATION = "tests/cuda_emulation/"


def build(tmp_path_factory, name, flags, sources):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on this machine")
    exe = str(tmp_path_factory.mktemp("emulation") / name)
    subprocess.run(
        [nvcc, "-std=c++17", "-O2", "-Iinclude", "-Isrc"]
        + flags + sources
        + ["src/core/pack.cpp", "src/host/elementwise.cpp", "-o", exe],
        cwd=REPO, check=True, timeout=600)
    return exe


@pytest.fixture(scope="module")
def tile_emulator(tmp_path_factory):
    return build(tmp_path_factory, "emulate_pack", [],
                 [EMULATION + "emulate_pack.cu"])


@pytest.fixture(scope="module")
def packer_emulator(tmp_path_factory):
    # The packer linked against the fake runtime instead of cudart; its
    # device code is compiled (for one architecture) but never run.
    return build(tmp_path_factory, "emulate_packer",
                 ["-cudart", "none", "-arch=sm_80"],
                 [EMULATION + "emulate_packer.cu",
                  EMULATION + "fake_cudart.cpp", "src/cuda/cuda_pack.cu"])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kernel_code_matches_host_twin(tile_emulator, seed):
    cases = 200
    out = subprocess.run([tile_emulator, str(cases), str(seed)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == f"emulate_pack: {cases} cases passed"


@pytest.mark.parametrize("seed", range(1, 11))
def test_packer_host_code_on_emulated_streams(packer_emulator, seed):
    out = subprocess.run([packer_emulator, str(seed)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "emulate_packer: all scenarios passed"
