"""A communicator built without CUDA (NNCOMM_CUDA=0), given arrays that
describe themselves as device memory: every collective placed on a device,
and gradient_reducer on them, raise that nncomm was built without CUDA on
every rank, before any rank communicates; host collectives go on working.

The arrays are host memory behind __cuda_array_interface__: nothing may
read them as device memory, or the build did not refuse them.
"""
import numpy as np

from _harness import Checker, make_comm, nd

BUILT_WITHOUT = "built without CUDA"


class PretendGpuArray:
    """Host memory described as CuPy describes device memory."""

    def __init__(self, values):
        self.values = np.ascontiguousarray(values)
        self.__cuda_array_interface__ = {
            "shape": self.values.shape, "typestr": self.values.dtype.str,
            "data": (self.values.ctypes.data, False), "version": 3,
            "strides": None, "stream": 1}


def main():
    ck = Checker("without_cuda")
    comm, _ = make_comm()
    size = comm.size
    x = PretendGpuArray(np.ones(8, np.float32))
    blocks = PretendGpuArray(np.ones(8 * size, np.float32))
    calls = {
        "all_reduce": lambda: comm.all_reduce(x),
        "bcast": lambda: comm.bcast(x, 0),
        "reduce": lambda: comm.reduce(x, 0),
        "all_gather": lambda: comm.all_gather(x, blocks),
        "reduce_scatter": lambda: comm.reduce_scatter(blocks, x),
        "gradient_reducer": lambda: comm.gradient_reducer([x], 64),
    }
    for what, call in calls.items():
        ck.raises(RuntimeError, BUILT_WITHOUT, what, call)
        ck.true(np.array_equal(x.values, np.ones(8, np.float32)),
                f"{what}: the array is untouched")
        # No rank entered a collective for the refused call, or this
        # host all_reduce would match it and fail or hang.
        y = nd(np.full(3, comm.rank + 1, np.float32))
        comm.all_reduce(y)
        ck.array(y, np.full(3, size * (size + 1) / 2, np.float32),
                 f"host all_reduce after {what}")
    ck.equal(comm.transport, "mpi", "transport")
    ck.equal(comm.is_capable("gpu"), False, "is_capable('gpu')")
    ck.finish()


if __name__ == "__main__":
    main()
