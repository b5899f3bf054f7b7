"""Builds nncomm: the Python package in python/ and its compiled core,
nncomm._nncomm, from the Cython in pyx/ and the C++ in src/ and include/.

The core is compiled and linked against the MPI that mpi4py runs on: the
flags come from that MPI's C++ compiler wrapper (``mpicxx -show``), looked up
first beside the running interpreter (where the PyPI ``mpich`` wheel puts
it), then on PATH; ``MPICXX`` names another wrapper.
"""
import glob
import os
import shlex
import shutil
import subprocess
import sys

import mpi4py
from Cython.Build import cythonize
from setuptools import Extension, setup


def mpi_build_flags():
    """include_dirs, library_dirs, libraries and rpaths of the MPI wrapper."""
    search = os.pathsep.join([os.path.dirname(sys.executable),
                              os.environ.get("PATH", "")])
    wrapper = os.environ.get("MPICXX") or shutil.which("mpicxx", path=search)
    if wrapper is None:
        sys.exit("nncomm: no mpicxx found; install the 'mpich' wheel "
                 "(pip install mpich) or set MPICXX")
    words = shlex.split(subprocess.check_output([wrapper, "-show"], text=True))
    flags = {"include_dirs": [], "library_dirs": [], "libraries": [],
             "runtime_library_dirs": []}
    linker = [w[len("-Wl,"):] for w in words if w.startswith("-Wl,")]
    for before, after in zip(linker, linker[1:]):
        if before == "-rpath":
            flags["runtime_library_dirs"].append(after)
    for w in words:
        for prefix, key in (("-I", "include_dirs"), ("-L", "library_dirs"),
                            ("-l", "libraries")):
            if w.startswith(prefix) and not w.startswith("-Wl,"):
                flags[key].append(w[len(prefix):])
    return flags


mpi = mpi_build_flags()
core = Extension(
    "nncomm._nncomm",
    sources=["pyx/_nncomm.pyx"] + sorted(glob.glob("src/*.cpp")),
    include_dirs=["include", "pyx", mpi4py.get_include()] + mpi["include_dirs"],
    library_dirs=mpi["library_dirs"],
    libraries=mpi["libraries"],
    runtime_library_dirs=mpi["runtime_library_dirs"],
    language="c++",
    extra_compile_args=["-std=c++17", "-O3", "-Wall"],
)

setup(
    name="nncomm",
    version="0.1.0",
    description="Distributed-training communicator for nnabla over MPI",
    package_dir={"": "python"},
    packages=["nncomm"],
    ext_modules=cythonize([core], include_path=["pyx"],
                          compiler_directives={"language_level": "3"}),
    python_requires=">=3.8",
    install_requires=["nnabla", "numpy", "mpi4py"],
)
