"""Builds nncomm: the Python package in python/ and its compiled modules from
the Cython in pyx/ and the C++/CUDA in src/ and include/:

- ``nncomm._nncomm``, the communicator, compiled and linked against the MPI
  that mpi4py runs on: the flags come from that MPI's C++ compiler wrapper
  (``mpicxx -show``), looked up first beside the running interpreter (where
  the PyPI ``mpich`` wheel puts it), then on PATH; ``MPICXX`` names another
  wrapper. ``NNCOMM_MPI=0`` leaves it out (a machine with no MPI to build
  against, where only the packing kernels are wanted). Its GPU path
  (src/**/*.cu: packer, device transports, runner, device path) is compiled
  where CUDA is, as below; without it, its entry points say so.
- ``nncomm.packing``, the bucket packing kernels, which need neither MPI nor
  nnabla.
- ``nncomm._quantize``, the quantized gradients' encoding and decoding on
  host memory, and ``nncomm._low_rank``, PowerSGD's passes over host
  gradients, which need neither MPI nor nnabla either.

The CUDA halves (.cu) are compiled with ``nvcc`` when nvcc is on PATH (or
under ``CUDA_HOME``); ``NNCOMM_CUDA=1`` makes a missing nvcc an error,
``NNCOMM_CUDA=0`` builds without CUDA even where nvcc is.
``NNCOMM_CUDA_ARCH`` lists the GPU architectures (default ``75;80;90``, plus
PTX of the last for newer GPUs). The CUDA runtime is linked statically, so
the modules import on machines without a GPU or a CUDA installation; NCCL
is loaded at run time, never linked.

For the tests only, ``NNCOMM_FAKE_CUDA=1`` links the CPU-side CUDA runtime
of tests/cuda_emulation (two emulated devices) in place of CUDA's, so that
the Python layer's GPU path runs where there is no GPU
(tests/test_gpu_python_emulated.py builds such a copy apart).
"""
import concurrent.futures
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CXXFLAGS = ["-std=c++17", "-O3", "-Wall"]


def host_has_f16c():
    """Whether this x86 processor converts float16 in hardware (F16C)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "f16c" in line.split()
                       for line in f)
    except OSError:
        return False


# Without F16C every float16 conversion is a library call: the host's
# float16 sums (MPI has none) ran at ~70 ns per element instead of ~9. The
# modules are built where they run (bootstrap.sh), so the build machine's
# processor is the one that matters.
if host_has_f16c():
    CXXFLAGS.append("-mf16c")


def env_switch(name):
    """True, False, or None (decide automatically) from '1', '0' or unset."""
    value = os.environ.get(name, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value in ("1", "on", "yes", "true"):
        return True
    if value in ("0", "off", "no", "false"):
        return False
    sys.exit(f"nncomm: {name}={value!r}: expected 1, 0 or auto")


def mpi_build_flags():
    """include_dirs, library_dirs, libraries and rpaths of the MPI wrapper."""
    search = os.pathsep.join([os.path.dirname(sys.executable),
                              os.environ.get("PATH", "")])
    wrapper = os.environ.get("MPICXX") or shutil.which("mpicxx", path=search)
    if wrapper is None:
        sys.exit("nncomm: no mpicxx found; install the 'mpich' wheel "
                 "(pip install mpich) or set MPICXX (or NNCOMM_MPI=0 to "
                 "build only nncomm.packing)")
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


def find_nvcc():
    """nvcc's path and the CUDA installation it belongs to, or None."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = shutil.which("nvcc", path=os.path.join(home, "bin")) if home \
        else shutil.which("nvcc")
    if nvcc is None:
        return None
    # nvcc may be a wrapper script; its own verbose output names its home.
    verbose = subprocess.run(
        [nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
        capture_output=True, text=True).stderr
    here = re.search(r"_HERE_=(\S+)", verbose)
    root = os.path.dirname(here.group(1)) if here else \
        os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    return nvcc, root


def cuda_library_dir(root):
    for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib")):
        path = os.path.join(root, sub)
        if os.path.exists(os.path.join(path, "libcudart_static.a")):
            return path
    sys.exit(f"nncomm: no libcudart_static.a under {root}")


def gencode_flags():
    archs = [a for a in re.split(r"[;, ]+",
                                 os.environ.get("NNCOMM_CUDA_ARCH", "75;80;90"))
             if a]
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    return flags + [f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}"]


# Extension name -> (nvcc, .cu sources) for BuildExt: kept aside because
# cythonize() rebuilds the Extension objects it is given.
CUDA_SOURCES = {}

# The compression modules' own sources (nncomm._quantize, nncomm._low_rank),
# left out of the communicator's.
QUANTIZE_SOURCE = os.path.join("src", "compression", "quantize.cpp")
LOW_RANK_SOURCE = os.path.join("src", "compression", "low_rank.cpp")

# What an extension is rebuilt after besides its sources: setuptools looks
# at no headers, and knows nothing of the .cu objects BuildExt links in.
DEPENDS = sorted(glob.glob("include/nncomm/**/*.hpp", recursive=True)
                 + glob.glob("src/**/*.[hc]*", recursive=True))


def in_parallel(jobs, function, items):
    """function(item) for each item, `jobs` at a time; the first error
    raised."""
    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(function, items))


class BuildExt(build_ext):
    """build_ext that first compiles an extension's .cu sources with nvcc
    into objects it links (setuptools knows no .cu), and compiles an
    extension's sources `-j` at a time (setuptools' -j only builds whole
    extensions side by side, and the communicator is one extension of
    some thirty sources)."""

    def jobs(self):
        if isinstance(self.parallel, int):
            return self.parallel
        return os.cpu_count() or 1

    def build_extensions(self):
        serial = self.compiler.compile

        def compile(sources, output_dir=None, macros=None, include_dirs=None,
                    debug=0, extra_preargs=None, extra_postargs=None,
                    depends=None):
            if len(sources) < 2 or self.jobs() < 2:
                return serial(sources, output_dir, macros, include_dirs,
                              debug, extra_preargs, extra_postargs, depends)
            return sum(in_parallel(self.jobs(), lambda s: serial(
                [s], output_dir, macros, include_dirs, debug, extra_preargs,
                extra_postargs, depends), sources), [])

        self.compiler.compile = compile
        super().build_extensions()

    def build_extension(self, ext):
        if ext.name in CUDA_SOURCES:
            nvcc, cuda_sources = CUDA_SOURCES[ext.name]
            temp = os.path.join(self.build_temp, ext.name)
            os.makedirs(temp, exist_ok=True)

            def compile_cuda(source):
                obj = os.path.join(temp, os.path.basename(source) + ".o")
                command = [nvcc, "-c", source, "-o", obj, "-std=c++17", "-O3",
                           "-Xcompiler", "-fPIC,-Wall"] + \
                    [f"-I{d}" for d in ext.include_dirs] + gencode_flags()
                print(" ".join(command))
                subprocess.check_call(command)
                return obj

            ext.extra_objects.extend(
                in_parallel(self.jobs(), compile_cuda, cuda_sources))
        super().build_extension(ext)


def cuda_build():
    """nvcc and its CUDA installation, or None, as NNCOMM_CUDA says."""
    want = env_switch("NNCOMM_CUDA")
    found = find_nvcc() if want is not False else None
    if want and found is None:
        sys.exit("nncomm: NNCOMM_CUDA=1 but no nvcc on PATH or under "
                 "CUDA_HOME")
    return found


CUDA = cuda_build()
FAKE_CUDA = env_switch("NNCOMM_FAKE_CUDA") is True
if FAKE_CUDA and CUDA is None:
    sys.exit("nncomm: NNCOMM_FAKE_CUDA=1 needs nvcc, for the GPU path's "
             "sources")
# The fake runtime, and the C entry points its Python users drive it by.
FAKE_CUDA_SOURCES = ["tests/cuda_emulation/fake_cudart.cpp",
                     "tests/cuda_emulation/fake_controls.cpp"]


def extension(name, sources, cuda_sources, without_cuda, **kwargs):
    """An Extension whose `cuda_sources` are compiled by nvcc where CUDA is,
    linked with the static CUDA runtime (or the fake, NNCOMM_FAKE_CUDA);
    elsewhere, or where there are none, `without_cuda` stand in for
    them."""
    kwargs["include_dirs"] = ["include", "src", "pyx"] + \
        kwargs.get("include_dirs", [])
    if CUDA is None or not cuda_sources:
        return Extension(name, sources=sources + without_cuda,
                         language="c++", extra_compile_args=CXXFLAGS,
                         depends=DEPENDS, **kwargs)
    nvcc, root = CUDA
    if FAKE_CUDA:
        CUDA_SOURCES[name] = (nvcc, cuda_sources + FAKE_CUDA_SOURCES)
        kwargs["include_dirs"] += ["tests/cuda_emulation"]
        runtime = ["dl", "pthread"]
    else:
        CUDA_SOURCES[name] = (nvcc, cuda_sources)
        kwargs.setdefault("library_dirs", []).append(cuda_library_dir(root))
        runtime = ["cudart_static", "dl", "rt", "pthread"]
    kwargs.setdefault("libraries", []).extend(runtime)
    return Extension(name, sources=sources, language="c++",
                     extra_compile_args=CXXFLAGS, depends=DEPENDS, **kwargs)


def communicator_extension():
    import mpi4py
    mpi = mpi_build_flags()
    sources = [s for s in sorted(glob.glob("src/**/*.cpp", recursive=True))
               if not os.path.basename(s).startswith("cuda_")
               and s not in (QUANTIZE_SOURCE, LOW_RANK_SOURCE)]
    return extension(
        "nncomm._nncomm", ["pyx/_nncomm.pyx"] + sources,
        sorted(glob.glob("src/**/*.cu", recursive=True)),
        ["src/cuda/cuda_unavailable.cpp",
         "src/cuda/cuda_device_path_unavailable.cpp"],
        include_dirs=[mpi4py.get_include()] + mpi["include_dirs"],
        library_dirs=list(mpi["library_dirs"]),
        libraries=list(mpi["libraries"]) + ["dl"],
        runtime_library_dirs=mpi["runtime_library_dirs"])


def packing_extension():
    return extension(
        "nncomm.packing",
        ["pyx/packing.pyx", "src/core/pack.cpp", "src/host/elementwise.cpp"],
        ["src/cuda/cuda_pack.cu", "src/cuda/cuda_devices.cu"],
        ["src/cuda/cuda_unavailable.cpp"])


def quantize_extension():
    return extension("nncomm._quantize",
                     ["pyx/_quantize.pyx", QUANTIZE_SOURCE], [], [])


def low_rank_extension():
    return extension("nncomm._low_rank",
                     ["pyx/_low_rank.pyx", LOW_RANK_SOURCE], [], [])


extensions = [packing_extension(), quantize_extension(), low_rank_extension()]
if env_switch("NNCOMM_MPI") is not False:
    extensions.insert(0, communicator_extension())

setup(
    name="nncomm",
    version="0.1.0",
    description="Distributed-training communicator for nnabla over MPI",
    package_dir={"": "python"},
    packages=["nncomm", "nncomm.nnabla_adapter"],
    ext_modules=cythonize(extensions, include_path=["pyx"],
                          compiler_directives={"language_level": "3"}),
    cmdclass={"build_ext": BuildExt},
    entry_points={"console_scripts": ["nncomm-run = nncomm.run:main"]},
    python_requires=">=3.8",
    install_requires=["nnabla", "numpy", "mpi4py"],
)
