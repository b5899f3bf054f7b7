"""The MLP of train_mlp.py trained through nncomm.DistributedSolver.

Run with any number of ranks:

    .venv/bin/nncomm-run -np 2 examples/train_distributed_solver.py

The solver wrapper does what train_mlp.py spells out: set_parameters()
gives every rank rank 0's weights, backward() all-reduces the gradients
while it runs, and update() refuses to step on gradients that were not
reduced, as Horovod's DistributedOptimizer does.
"""
import argparse

import nnabla as nn
import nnabla.functions as F
import nnabla.solvers as S
import numpy as np
from nnabla.ext_utils import get_extension_context

import nncomm
import nncomm.communicators as C
from train_mlp import mlp, parameters_match, spirals


def train(description, wrap):
    """Trains the MLP with the solver ``wrap(S.Momentum(lr, 0.9), comm)``
    returns, as the command line says, and reports whether the ranks end
    with the same parameters.

    Args:
        description (str): The command line's help.
        wrap (callable): Makes the distributed solver.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64,
                        help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()

    x_all, y_all = spirals(4096, seed=0)
    x_train, y_train = x_all[comm.rank::comm.size], y_all[comm.rank::comm.size]
    x = nn.Variable((args.batch_size, 2))
    y = nn.Variable((args.batch_size, 1))
    loss = F.mean(F.softmax_cross_entropy(mlp(x, 64), y))

    solver = wrap(S.Momentum(args.lr, 0.9), comm)
    solver.set_parameters(nn.get_parameters())
    rng = np.random.RandomState(comm.rank)
    steps = len(x_train) // args.batch_size
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            x.d, y.d = x_train[batch], y_train[batch]
            loss.forward()
            solver.zero_grad()
            solver.backward(loss, clear_buffer=True)
            solver.update()
        if comm.rank == 0:
            print(f"epoch {epoch + 1:3d}  last loss {float(loss.d):.4f}",
                  flush=True)
    same = parameters_match(comm, nn.get_parameters())
    if comm.rank == 0:
        print(f"parameter checksums {'match' if same else 'DIFFER'} across "
              f"{comm.size} ranks")


def main():
    train(__doc__.split("\n")[0], nncomm.DistributedSolver)


if __name__ == "__main__":
    main()
