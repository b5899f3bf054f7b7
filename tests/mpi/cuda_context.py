"""NdArrays of a CUDA context go to the GPU path, never to host MPI.

This machine has no GPU and no nnabla-ext-cuda, so the communicator's
check for them is stood in for (nncomm.cuda_context.missing_pieces says
nothing is missing), and the context's arrays are nnabla's CPU arrays: a
context with backend cudnn:float and array class CpuCachedArray. Every
collective, all_reduce_callback's first hook and gradient_reducer must
then take the GPU path and raise RuntimeError naming CUDA on every rank
(the device group finds no device for the arrays); had any of them gone
to host MPI, it would have returned instead. The communicator still works
after each refusal.
"""
import numpy as np

import nnabla as nn
from nnabla.ext_utils import get_extension_context

import nncomm.communicators as C
from nncomm import cuda_context

from _harness import Checker, exception_chain, nd, three_layer_mlp

ck = Checker("cuda_context")
cuda_context.missing_pieces = lambda: []
ctx = nn.Context(backend=["cudnn:float"], array_class="CpuCachedArray",
                 device_id="0")
comm = C.MultiProcessDataParallelCommunicator(ctx)
comm.init()
n = comm.size
nn.set_default_context(get_extension_context("cpu"))


def refused(what, call):
    try:
        call()
    except Exception as e:
        # nnabla wraps what a hook raises in SystemErrors.
        chain = exception_chain(e)
        ck.true("RuntimeError" in chain and "CUDA" in chain, what, chain)
    else:
        ck.fail(what, "returned: the arrays went to host MPI")
    # Every rank is still matched: a barrier and a host collective through
    # a CPU communicator pass.
    comm.barrier()


a = nd(np.ones(6, np.float32))
refused("all_reduce", lambda: comm.all_reduce(a))
refused("all_reduce division", lambda: comm.all_reduce([a], division=True))
refused("reduce", lambda: comm.reduce(a, 0))
refused("bcast", lambda: comm.bcast(a, 0))
refused("all_gather",
        lambda: comm.all_gather(a, [nd(np.zeros(6, np.float32))
                                    for _ in range(n)]))
refused("reduce_scatter",
        lambda: comm.reduce_scatter([nd(np.ones(6, np.float32))
                                     for _ in range(n)], a))
refused("alltoall", lambda: comm.alltoall(nd(np.ones((2 * n, 3),
                                                    np.float32))))
refused("all_gather into a new array",
        lambda: comm.all_gather(nd(np.ones((comm.rank + 1, 3), np.float32))))
refused("gradient_reducer", lambda: comm.gradient_reducer([a], 64))

x, t, loss, names, params = three_layer_mlp(5)
x.d = np.ones(x.shape)
t.d = np.zeros(t.shape)
loss.forward()
cb = comm.all_reduce_callback([p.grad for p in params], 64)
refused("all_reduce_callback",
        lambda: loss.backward(function_post_hook=cb))
ck.finish()
