"""A failure of one rank alone reaches the others: it never leaves them
waiting.

The last rank refuses every staging or fusion buffer of 4 KiB or more
(NNCOMM_TEST_FAIL_ALLOCATION, set here on that rank only) and then:

- callback: the callback's engine cannot allocate its staging buffer;
  every rank's first backward raises (MemoryError on the last rank,
  "another rank ... could not allocate" on the others), and a callback
  with small buckets still works afterwards.
- all_reduce: an all_reduce whose fused message needs a large buffer; the
  last rank raises MemoryError before communicating and the job is
  aborted, so the others cannot wait for it (tests/test_mpi.py checks the
  exit and its speed).
"""
import os
import sys

import numpy as np
from mpi4py import MPI

from _harness import (Checker, exception_chain, make_comm, nd,
                      scaled_reference, world_gather)

MODE = sys.argv[1]
LIMIT = 4096

if MPI.COMM_WORLD.rank == MPI.COMM_WORLD.size - 1:
    os.environ["NNCOMM_TEST_FAIL_ALLOCATION"] = str(LIMIT)


def model():
    """An affine layer of 40 x 40 weights: 6,560 bytes of gradients."""
    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    x, t = nn.Variable((2, 40)), nn.Variable((2, 40))
    with nn.parameter_scope("local_failures"):
        loss = F.mean(F.squared_error(PF.affine(x, 40, name="a"), t))
        params = nn.get_parameters()
    return x, t, loss, list(params), list(params.values())


def callback(ck, comm):
    x, t, loss, names, params = model()
    grads = [p.grad for p in params]
    world = list(range(comm.size))
    last = comm.rank == comm.size - 1

    def backward(hook=None):
        x.d = np.full(x.shape, comm.rank + 1.0, np.float32)
        t.d = 0
        loss.forward()
        for p in params:
            p.grad.zero()
        loss.backward(function_post_hook=hook)

    # One bucket of every gradient needs more staging than the last rank
    # allows; buckets of 1,000 elements (4,000 bytes) fit.
    ck.count += 1
    try:
        backward(comm.all_reduce_callback(grads, 2 << 20))
        ck.fail("a callback whose staging one rank cannot allocate",
                "backward did not raise")
    except Exception as e:
        chain = exception_chain(e)
        expected = "NNCOMM_TEST_FAIL_ALLOCATION" if last else \
            "another rank of the group could not allocate"
        ck.true(expected in chain, "a callback whose staging one rank "
                "cannot allocate raises on every rank", chain)
    backward()
    gathered = world_gather(grads)
    backward(comm.all_reduce_callback(grads, 1000, division=True))
    for i, p in enumerate(params):
        ref, tol = scaled_reference([gathered[r][i] for r in world], 1, True)
        ck.array(p.grad, ref, f"a callback that fits, after: {names[i]}",
                 np.float32, tol)


def all_reduce(comm):
    # Small arrays, fused into one message of about 8 KiB.
    comm.all_reduce([nd(np.ones(100, np.float32)) for _ in range(20)])


def main():
    ck = Checker("local_failures")
    comm, _ = make_comm()
    if MODE == "callback":
        callback(ck, comm)
    else:
        all_reduce(comm)
    ck.finish()


main()
