"""A data-parallel nnabla script as nnabla's users write them: it never
imports nncomm. Trains a small ResNet (a convolution, a residual block,
pooling, an affine layer) with sync batch normalization
(``PF.sync_batch_normalization``; plain batch normalization on a single
rank) for a few SGD steps on a fixed global
batch, each rank on its share, the gradients averaged over the ranks
during backward by a callback made every step and passed as nnabla-examples
pass it (``communicator_callbacks=``), and saves each rank's parameters to
OUT.rank<r>.npz, running statistics included.

Usage: train_data_parallel.py HOW OUT, where HOW is how the script gets
its communicator:
- factory: ``nnabla.communicators.MultiProcessDataParallelCommunicator``;
- create: ``nnabla.utils.communicator_util.create_communicator()`` (None
  on a single rank), for a CPU context;
- create_default: the same with nnabla's defaults (a cudnn context, which
  a CPU-only machine lacks), as nnabla-examples call it;
- wrapper: a wrapper class that catches every exception from
  ``nnabla.communicators`` and carries on single-process, as
  nnabla-examples' ``CommunicatorWrapper`` does.
"""
import os
import sys

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context

HOW, OUT = sys.argv[1], sys.argv[2]
STEPS, BATCH, IMAGE, CLASSES = 4, 16, (2, 5, 5), 3


class Wrapper:
    """A single process where no communicator can be made."""

    def __init__(self, ctx):
        try:
            import nnabla.communicators as C
            comm = C.MultiProcessDataParallelCommunicator(ctx)
            comm.init()
            self.comm, self.size, self.rank = comm, comm.size, comm.rank
        except Exception as e:
            print(f"no communicator ({e}); running with a single process")
            self.comm, self.size, self.rank = None, 1, 0


ctx = get_extension_context("cpu")
nn.set_default_context(ctx)
if HOW == "factory":
    import nnabla.communicators as C
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
elif HOW == "create":
    from nnabla.utils.communicator_util import create_communicator
    comm = create_communicator(extension_module="cpu")
elif HOW == "create_default":
    from nnabla.utils.communicator_util import create_communicator
    comm = create_communicator(ignore_error=True)
else:
    comm = Wrapper(ctx).comm
size, rank = (comm.size, comm.rank) if comm is not None else (1, 0)

rng = np.random.RandomState(0)
x_all = rng.randn(BATCH, *IMAGE).astype(np.float32)
t_all = rng.randint(0, CLASSES, (BATCH, 1))
share = BATCH // size
x = nn.Variable.from_numpy_array(x_all[rank * share:(rank + 1) * share])
t = nn.Variable.from_numpy_array(t_all[rank * share:(rank + 1) * share])
nn.seed(0)


def conv_bn(h, name):
    with nn.parameter_scope(name):
        h = PF.convolution(h, 4, (3, 3), pad=(1, 1), with_bias=False)
        return (PF.batch_normalization(h) if comm is None else
                PF.sync_batch_normalization(h, comm))


h = F.relu(conv_bn(x, "stem"))
h = F.relu(h + conv_bn(F.relu(conv_bn(h, "block1")), "block2"))
logits = PF.affine(F.mean(h, axis=(2, 3)), CLASSES, name="out")
loss = F.mean(F.softmax_cross_entropy(logits, t))
params = nn.get_parameters()
solver = S.Sgd(0.5)
solver.set_parameters(params)
for _ in range(STEPS):
    solver.zero_grad()
    loss.forward()
    cb = None if comm is None else comm.all_reduce_callback(
        [p.grad for p in params.values()], 2 << 20, division=True)
    loss.backward(clear_buffer=True, communicator_callbacks=cb)
    solver.update()
np.savez(f"{OUT}.rank{rank}.npz",
         **{name: p.d for name, p in nn.get_parameters(
             grad_only=False).items()})
# One write, so that mpiexec never interleaves it with another rank's.
os.write(sys.stdout.fileno(), f"rank {rank} of {size} trained\n".encode())
