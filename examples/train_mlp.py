"""Data-parallel training of a small MLP with nncomm.

Run with any number of ranks:

    .venv/bin/nncomm-run -np 2 examples/train_mlp.py

On GPUs, where nnabla-ext-cuda is installed, ``--context cudnn`` trains on
the device of each rank's local rank, as nnabla's examples do.

It is an ordinary nnabla data-parallel script: the only nncomm-specific line
is ``import nncomm.communicators as C`` (nnabla's would be
``import nnabla.communicators as C``, which has no CPU implementation). Each
rank trains on its own shard of a synthetic two-spirals dataset; gradients
are averaged with ``all_reduce`` after every backward pass, so every rank
holds the same parameters throughout. With ``--overlap`` they are averaged
during backward instead, by ``all_reduce_callback``.
"""
import argparse

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
import numpy as np
from nnabla.ext_utils import get_extension_context

import nncomm.communicators as C


def spirals(n, seed):
    """Two interleaved spirals: points (n, 2) and labels (n, 1)."""
    rng = np.random.RandomState(seed)
    t = np.sqrt(rng.rand(n)) * 3 * np.pi
    label = rng.randint(0, 2, n)
    sign = np.where(label == 1, 1.0, -1.0)
    x = np.stack([sign * t * np.cos(t), sign * t * np.sin(t)], axis=1) / 10
    x += rng.randn(n, 2) * 0.05
    return x.astype(np.float32), label.reshape(-1, 1).astype(np.int32)


def mlp(x, hidden):
    h = F.relu(PF.affine(x, hidden, name="fc1"))
    h = F.relu(PF.affine(h, hidden, name="fc2"))
    return PF.affine(h, 2, name="fc3")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64,
                        help="per rank")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--overlap", action="store_true",
                        help="reduce during backward (all_reduce_callback)")
    parser.add_argument("--context", default="cpu",
                        help="nnabla extension: cpu, cuda or cudnn")
    args = parser.parse_args()

    ctx = get_extension_context(args.context)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    if args.context != "cpu":
        ctx.device_id = str(comm.local_rank)
    nn.set_default_context(ctx)

    # Every rank sees the same dataset and keeps the shard of its rank.
    x_all, y_all = spirals(4096, seed=0)
    x_train = x_all[comm.rank::comm.size]
    y_train = y_all[comm.rank::comm.size]

    x = nn.Variable((args.batch_size, 2))
    y = nn.Variable((args.batch_size, 1))
    logits = mlp(x, args.hidden)
    loss = F.mean(F.softmax_cross_entropy(logits, y))

    # Different seeds give different initial weights; rank 0's win.
    params = nn.get_parameters()
    comm.bcast([p.data for p in params.values()], src=0)

    grads = [p.grad for p in params.values()]
    solver = S.Momentum(args.lr, 0.9)
    solver.set_parameters(params)
    rng = np.random.RandomState(comm.rank)
    steps = len(x_train) // args.batch_size
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        total = nn.NdArray.from_numpy_array(np.zeros((), np.float32))
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            x.d, y.d = x_train[batch], y_train[batch]
            loss.forward()
            solver.zero_grad()
            if args.overlap:
                cb = comm.all_reduce_callback(grads, 2 << 20, division=True)
                loss.backward(function_post_hook=cb)
            else:
                loss.backward()
                comm.all_reduce(grads, division=True)
            solver.update()
            total.data += loss.d
        comm.all_reduce(total, division=True)
        if comm.rank == 0:
            print(f"epoch {epoch + 1:3d}  loss {float(total.data) / steps:.4f}",
                  flush=True)

    # Evaluate on the whole dataset, each rank its shard, summed over ranks.
    xe = nn.Variable(x_train.shape)
    xe.d = x_train
    pred = mlp(xe, args.hidden)
    pred.forward()
    correct = (pred.d.argmax(axis=1) == y_train[:, 0]).sum()
    counts = nn.NdArray.from_numpy_array(
        np.array([correct, len(x_train)], np.int64))
    comm.all_reduce(counts)
    same = parameters_match(comm, params)
    if comm.rank == 0:
        c, n = counts.data
        print(f"accuracy {c / n:.3f} on {n} points; parameter checksums "
              f"{'match' if same else 'DIFFER'} across {comm.size} ranks")


def parameters_match(comm, params):
    """Whether every rank holds the same parameters, by a checksum gathered
    from every rank."""
    checksum = nn.NdArray.from_numpy_array(np.array(
        [sum(float(p.d.sum()) for p in params.values())], np.float64))
    sums = nn.NdArray((comm.size,))
    comm.all_gather(checksum, sums)
    return np.ptp(sums.data) == 0


if __name__ == "__main__":
    main()
