"""A data-parallel script written for nnabla's own communicator, as
nnabla-examples write them; it never imports nncomm. Under nncomm's
launcher it trains on every rank together, on CPU:

    .venv/bin/nncomm-run -np 2 examples/nnabla_script.py

(or ``mpiexec -n 2 python -m nncomm examples/nnabla_script.py``).

A communicator wrapper that carries on alone when nnabla has no
communicator; the gradients all-reduced during backward by the callback
passed in ``communicator_callbacks=``; batch normalization over every
rank's batch (``PF.sync_batch_normalization``); each rank its shard of
scikit-learn's digits; rank 0 reports.
"""
import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context
from sklearn.datasets import load_digits


class CommunicatorWrapper:
    def __init__(self, ctx):
        try:
            import nnabla.communicators as C
            self.comm = C.MultiProcessDataParallelCommunicator(ctx)
            self.comm.init()
            self.n_procs, self.rank = self.comm.size, self.comm.rank
        except Exception as e:
            print(f"{e}\nNo communicator found. Running with a single "
                  f"process.")
            self.comm, self.n_procs, self.rank = None, 1, 0

    def all_reduce_callback(self, params):
        if self.comm is None:
            return None
        return self.comm.all_reduce_callback([p.grad for p in params],
                                             2 << 20, division=True)


def model(x, comm, test=False):
    h = PF.affine(x, 64, name="fc1")
    if comm is not None and not test:
        h = PF.sync_batch_normalization(h, comm, name="bn")
    else:
        h = PF.batch_normalization(h, batch_stat=not test, name="bn")
    return PF.affine(F.relu(h), 10, name="fc2")


def main():
    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = CommunicatorWrapper(ctx)
    digits = load_digits()
    images = (digits.data / 16).astype(np.float32)
    labels = digits.target.reshape(-1, 1)
    train, test = slice(0, 1440), slice(1440, None)

    batch = 32
    x, t = nn.Variable((batch, 64)), nn.Variable((batch, 1))
    loss = F.mean(F.softmax_cross_entropy(model(x, comm.comm), t))
    params = nn.get_parameters().values()
    solver = S.Adam(0.01)
    solver.set_parameters(nn.get_parameters())
    rng = np.random.RandomState(0)   # the same shuffles on every rank
    for epoch in range(5):
        order = rng.permutation(1440)[comm.rank::comm.n_procs]
        for i in range(len(order) // batch):
            chosen = order[i * batch:(i + 1) * batch]
            x.d, t.d = images[train][chosen], labels[train][chosen]
            loss.forward(clear_no_need_grad=True)
            solver.zero_grad()
            loss.backward(clear_buffer=True,
                          communicator_callbacks=comm.all_reduce_callback(
                              params))
            solver.update()
        if comm.rank == 0:
            print(f"epoch {epoch + 1} loss {float(loss.d):.4f}")

    x_test = nn.Variable.from_numpy_array(images[test])
    with nn.auto_forward():
        logits = model(x_test, comm.comm, test=True)
    accuracy = np.mean(logits.d.argmax(axis=1) == labels[test][:, 0])
    if comm.rank == 0:
        print(f"{comm.n_procs} ranks: test accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
