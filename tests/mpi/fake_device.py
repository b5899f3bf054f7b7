"""Arrays in the device memory of the fake CUDA runtime (tests/cuda_emulation)
that ``nncomm._nncomm`` was built over (setup.py's ``NNCOMM_FAKE_CUDA=1``),
described by ``__cuda_array_interface__`` as CuPy describes its own, with
the few of CuPy's functions that gpu_arrays.py's checks use.

The runtime runs enqueued work late, in a random order that keeps only
what CUDA promises, so a collective that reads an array before the work
writing it, or is read before it has written, gives wrong values. Every
copy here goes through pinned memory on the legacy default stream, the
stream the arrays name.
"""
import ctypes

import numpy as np

LEGACY_STREAM = 1   # CUDA's handle of the legacy default stream
HOST_TO_DEVICE, DEVICE_TO_HOST = 1, 2


class FakeArray:
    """`shape` elements of `dtype` at `ptr` on fake device `device`."""

    def __init__(self, runtime, ptr, shape, dtype, device):
        self.runtime, self.ptr, self.device = runtime, ptr, device
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.__cuda_array_interface__ = {
            "shape": self.shape, "typestr": self.dtype.str,
            "data": (ptr, False), "version": 3, "strides": None,
            "stream": LEGACY_STREAM}

    @property
    def nbytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


class FakeCupy:
    """CuPy's asarray, asnumpy, zeros, zeros_like and full over the fake
    runtime's device `device` (arrays are never freed: freeing memory that
    pending work uses stops the fake)."""

    ndarray = FakeArray

    def __init__(self, module_path, device, seed):
        rt = ctypes.CDLL(module_path)  # the loaded module: its runtime
        for name in ("cudaMalloc", "cudaMallocHost"):
            getattr(rt, name).argtypes = [ctypes.POINTER(ctypes.c_void_p),
                                          ctypes.c_size_t]
        rt.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                       ctypes.c_size_t, ctypes.c_int,
                                       ctypes.c_void_p]
        rt.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        rt.cudaSetDevice.argtypes = [ctypes.c_int]
        rt.nncomm_fake_configure_c.argtypes = [ctypes.c_uint64,
                                               ctypes.c_uint]
        rt.nncomm_fake_pending_c.restype = ctypes.c_size_t
        rt.nncomm_fake_configure_c(seed, 3)
        self.rt, self.device = rt, device
        self._staging = {}

    def _call(self, name, *args):
        err = getattr(self.rt, name)(*args)
        if err != 0:
            raise RuntimeError(f"fake {name} failed: error {err}")

    def _pinned(self, nbytes):
        """Pinned host memory of `nbytes`, one buffer per size."""
        if nbytes not in self._staging:
            p = ctypes.c_void_p()
            self._call("cudaMallocHost", ctypes.byref(p), max(nbytes, 1))
            self._staging[nbytes] = p.value
        return self._staging[nbytes]

    def empty(self, shape, dtype, device=None):
        """An array of no elements at address 0, as CuPy makes one."""
        device = self.device if device is None else device
        shape = (shape,) if np.isscalar(shape) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if nbytes == 0:
            return FakeArray(self.rt, 0, shape, dtype, device)
        self._call("cudaSetDevice", device)
        p = ctypes.c_void_p()
        self._call("cudaMalloc", ctypes.byref(p), nbytes)
        return FakeArray(self.rt, p.value, shape, dtype, device)

    def write(self, x, values):
        """Enqueues values (numpy) into `x` on the legacy stream, as a
        kernel of the compute stream would write them."""
        values = np.ascontiguousarray(values, x.dtype)
        assert values.nbytes == x.nbytes
        if x.nbytes == 0:
            return
        self._call("cudaSetDevice", x.device)
        pinned = self._pinned(x.nbytes)
        # The copy before from this buffer must be done with it.
        self._call("cudaStreamSynchronize", LEGACY_STREAM)
        ctypes.memmove(pinned, values.ctypes.data, x.nbytes)
        self._call("cudaMemcpyAsync", x.ptr, pinned, x.nbytes,
                   HOST_TO_DEVICE, LEGACY_STREAM)

    def asarray(self, values, device=None):
        values = np.asarray(values)
        x = self.empty(values.shape, values.dtype, device)
        self.write(x, values)
        return x

    def asnumpy(self, x):
        if x.nbytes == 0:
            return np.empty(x.shape, x.dtype)
        self._call("cudaSetDevice", x.device)
        pinned = self._pinned(x.nbytes)
        self._call("cudaMemcpyAsync", pinned, x.ptr, x.nbytes,
                   DEVICE_TO_HOST, LEGACY_STREAM)
        self._call("cudaStreamSynchronize", LEGACY_STREAM)
        out = np.empty(x.shape, x.dtype)
        ctypes.memmove(out.ctypes.data, pinned, x.nbytes)
        return out

    def zeros(self, shape, dtype):
        return self.asarray(np.zeros(shape, dtype))

    def zeros_like(self, x):
        return self.zeros(x.shape, x.dtype)

    def full(self, shape, value, dtype):
        return self.asarray(np.full(shape, value, dtype))

    def pending(self):
        """Work enqueued on the fake device and not yet run."""
        return self.rt.nncomm_fake_pending_c()
