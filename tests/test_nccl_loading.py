"""NCCL is loaded at run time (src/transports/nccl_api.cpp): a missing
library, a missing symbol and a too old version are refused with messages
that say what to install; a good one loads, once per process. Stand-in
libraries (tests/nccl_loading/fake_libnccl.cpp) play NCCL; no GPU or NCCL
needed."""
import ctypes.util
import os
import shutil
import sys
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(REPO, "tests", "nccl_loading")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++ on this machine")
    out = tmp_path_factory.mktemp("nccl_loading")
    libraries = {"good": ["-DVERSION=22300"],
                 "old": ["-DVERSION=21000"],
                 "partial": ["-DVERSION=21000", "-DWITHOUT_PREMULSUM"]}
    for name, flags in libraries.items():
        subprocess.run([cxx, "-shared", "-fPIC", *flags,
                        os.path.join(HERE, "fake_libnccl.cpp"), "-o",
                        str(out / f"{name}.so")], check=True, timeout=120)
    subprocess.run([cxx, "-std=c++17", "-I" + os.path.join(REPO, "include"),
                    os.path.join(HERE, "try_load.cpp"),
                    os.path.join(REPO, "src", "transports", "nccl_api.cpp"),
                    "-ldl", "-o", str(out / "try_load")],
                   check=True, timeout=120)
    return out


def library(built, name):
    return str(built / (f"{name}.so" if name != "missing" else
                        "no_such_libnccl.so"))


def try_load(built, *args):
    run = subprocess.run([str(built / "try_load"), *args],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def load(built, *names):
    return try_load(built, *(library(built, n) for n in names))


def test_missing_library_says_what_to_install(built):
    [line] = load(built, "missing")
    assert "NCCL could not be loaded" in line and "no_such_libnccl" in line
    assert "pip install nvidia-nccl-cu12" in line
    assert "NNCOMM_GPU_TRANSPORT=mpi" in line


def test_missing_symbol_is_named(built):
    [line] = load(built, "partial")
    assert "has no ncclRedOpCreatePreMulSum" in line, line
    assert "2.11 or newer" in line


def test_old_version_is_refused(built):
    [line] = load(built, "old")
    assert "NCCL version 21000" in line and "2.11 or newer" in line, line


def test_good_library_loads_once(built):
    # After a failure the loader tries again; once loaded, another path is
    # refused rather than mixed in.
    first, second, third = load(built, "missing", "good", "old")
    assert "could not be loaded" in first
    assert second == "loaded"
    assert "loaded from" in third and "cannot load" in third, third


@pytest.mark.skipif(ctypes.util.find_library("nccl") is not None,
                    reason="the dynamic loader finds a system NCCL first")
def test_default_search_goes_on_to_the_candidates(built):
    # Where the loader finds no libnccl.so.2, the wheels' copies are tried
    # in order, and a failure names every place tried.
    missing, good = library(built, "missing"), library(built, "good")
    first, second = try_load(built, "--candidate", missing, "-",
                             "--candidate", good, "-")
    assert "libnccl.so.2" in first and missing in first, first
    assert "pip install nvidia-nccl-cu12" in first
    assert second == "loaded"


def test_the_wheels_copies_are_found_on_the_import_path(tmp_path):
    # As pip lays out nvidia-nccl-cu12/-cu13 in two site directories (a
    # venv's and the system's); a directory without it is passed over.
    sites = [tmp_path / "venv", tmp_path / "system", tmp_path / "empty"]
    for site in sites[:2]:
        lib = site / "nvidia" / "nccl" / "lib"
        lib.mkdir(parents=True)
        (lib / "libnccl.so.2").write_bytes(b"")
    sites[2].mkdir()
    code = ("import sys; from nncomm import nccl_wheels; "
            "print('\\n'.join(nccl_wheels.libraries()))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(sites[2]), str(sites[0]), os.path.join(REPO, "python"),
         str(sites[1]), str(sites[0])]))
    run = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [
        str(s / "nvidia" / "nccl" / "lib" / "libnccl.so.2")
        for s in sites[:2]]
