"""Data-parallel training of a small ResNet on scikit-learn's digits with
nncomm, with checkpoints and resume.

Run with any number of ranks:

    .venv/bin/nncomm-run -np 2 examples/train_resnet_digits.py

It is laid out as nnabla-examples' distributed image classification: one
communicator, each rank training on its own shard of the data, gradients
averaged after every backward pass (``--overlap``: during it, by
``all_reduce_callback`` passed to ``backward(communicator_callbacks=...)``
as nnabla-examples do), rank 0 reporting and saving. ``--sync-bn``
normalizes over every rank's batch together, with nnabla's own
``PF.sync_batch_normalization``. The 8x8 digits come with scikit-learn, so
nothing is downloaded.

Each epoch shuffles the training set with a seed every rank shares
(``--seed`` and the epoch) and gives each rank a disjoint slice of it, so
that together the ranks see every image once.

Batch normalization's running statistics take no gradient, and each rank's
come from its own shard, so they drift apart. They are averaged over the
ranks before every evaluation and checkpoint, so that every rank evaluates
and saves the same model. (Averaging the variances leaves out the spread
of the ranks' means, negligible for shards of the same data; with
``--sync-bn`` the ranks' statistics are those of the global batch, the
same on every rank.)

``--checkpoint-dir DIR`` makes rank 0 save, after every epoch, the
parameters (running statistics included) with ``nn.save_parameters``, the
solver's state with ``solver.save_states`` and a record of the epoch.
``--resume`` (or ``--resume EPOCH``) loads the last (or that epoch's) on
rank 0 and broadcasts it to every rank; training then goes on from the
next epoch exactly as it would have without stopping: the shuffles and the
learning rate depend only on ``--seed``, ``--epochs`` and the step.
"""
import argparse
import collections
import json
import os
import re

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
import numpy as np
from nnabla.ext_utils import get_extension_context
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm

import nncomm
import nncomm.communicators as C
from train_mlp import parameters_match

# --resume without an epoch: the last checkpoint.
LATEST = 0

# An evaluation over the whole test set.
Figures = collections.namedtuple("Figures", "loss accuracy correct count")


def digits(seed):
    """Scikit-learn's digits, scaled to [0, 1] and split 80:20 with both
    parts holding each class in the same proportion.

    Returns:
        tuple: ``(x_train, y_train), (x_test, y_test)``: images
        ``(n, 1, 8, 8)`` and labels ``(n, 1)``.
    """
    data = load_digits()
    x = (data.images[:, None] / 16).astype(np.float32)
    y = data.target.reshape(-1, 1).astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y)
    return (x_train, y_train), (x_test, y_test)


def batch_norm(h, test, comm):
    """Batch normalization: over every rank's batch together where `comm`
    is given (nnabla's sync batch normalization), else over this rank's."""
    if comm is None:
        return PF.batch_normalization(h, batch_stat=not test)
    return PF.sync_batch_normalization(h, comm, batch_stat=not test)


def conv_bn(x, maps, test, comm, name, stride=1):
    """A 3x3 convolution and batch normalization, under ``name``."""
    with nn.parameter_scope(name):
        h = PF.convolution(x, maps, (3, 3), pad=(1, 1), stride=(stride,) * 2,
                           with_bias=False)
        return batch_norm(h, test, comm)


def resnet(x, test, maps, blocks, comm=None):
    """Logits of a ResNet for 10 classes: a stem convolution, ``blocks``
    residual blocks at 8x8, ``blocks`` at 4x4 with twice the maps (the
    first of them strided, with a projection shortcut), global average
    pooling and an affine layer; sync batch normalization over `comm`'s
    ranks where it is given."""
    h = F.relu(conv_bn(x, maps, test, comm, "stem"))
    for stage, width in enumerate((maps, 2 * maps)):
        for block in range(blocks):
            stride = 2 if stage and not block else 1
            with nn.parameter_scope(f"stage{stage + 1}/block{block + 1}"):
                r = F.relu(conv_bn(h, width, test, comm, "conv1", stride))
                r = conv_bn(r, width, test, comm, "conv2")
                if stride != 1:
                    with nn.parameter_scope("shortcut"):
                        h = batch_norm(PF.convolution(
                            h, width, (1, 1), stride=(2, 2), with_bias=False),
                            test, comm)
                h = F.relu(h + r)
    return PF.affine(F.mean(h, axis=(2, 3)), 10, name="fc")


def summed(comm, *values):
    """The sums over the ranks of this rank's ``values`` (numbers)."""
    totals = nn.NdArray.from_numpy_array(np.array(values, np.float64))
    comm.all_reduce(totals)
    return totals.data


def evaluate(comm, logits, loss, labels):
    """Mean loss and accuracy over every rank's test shard together.

    Returns:
        Figures: Over the whole test set.
    """
    loss.forward()
    correct = (logits.d.argmax(axis=1) == labels[:, 0]).sum()
    total, correct, count = summed(comm, loss.d, correct, len(labels))
    return Figures(total / count, correct / count, int(correct), int(count))


def checkpoint_files(directory, epoch):
    """The paths of an epoch's parameters, solver state and record."""
    stem = os.path.join(directory, f"epoch{epoch:03d}")
    return stem + ".params.h5", stem + ".solver.h5", stem + ".json"


def save_checkpoint(directory, epoch, solver, figures):
    """Rank 0's side of a checkpoint: the parameters and the solver state
    at the end of ``epoch``, then a record of the epoch and its test loss
    and accuracy (``figures``, :class:`Figures`), written whole in one
    step: the record marks the checkpoint complete."""
    os.makedirs(directory, exist_ok=True)
    params, states, record = checkpoint_files(directory, epoch)
    nn.save_parameters(params)
    solver.save_states(states)
    with open(record + ".tmp", "w") as f:
        json.dump({"epoch": epoch, "test_loss": figures.loss,
                   "test_accuracy": figures.accuracy}, f)
    os.replace(record + ".tmp", record)


def latest_epoch(directory):
    """The last epoch with a complete checkpoint in ``directory``."""
    epochs = [int(m.group(1)) for m in (
        re.fullmatch(r"epoch(\d+)\.json", name)
        for name in os.listdir(directory)) if m]
    if not epochs:
        raise FileNotFoundError(f"no checkpoint in {directory}")
    return max(epochs)


def load_checkpoint(comm, directory, epoch, solver):
    """Loads the checkpoint of ``epoch`` (:data:`LATEST`: the last) on rank 0
    and gives every rank its parameters and solver state.

    Returns:
        int: The epoch of the checkpoint.

    Raises:
        RuntimeError: On every rank, where rank 0 cannot load it.
    """
    if comm.rank == 0:
        try:
            epoch = epoch or latest_epoch(directory)
            params, states, record = checkpoint_files(directory, epoch)
            if not os.path.exists(record):
                raise FileNotFoundError(f"no complete checkpoint of epoch "
                                        f"{epoch} in {directory}")
            nn.load_parameters(params)
            solver.load_states(states)
        # Whatever stops rank 0 goes to every rank, so that none waits
        # for the broadcasts below.
        except Exception as e:
            epoch = f"{type(e).__name__}: {e}"
    epoch = nncomm.broadcast_object(comm, epoch)
    if isinstance(epoch, str):
        raise RuntimeError(f"cannot resume from {directory}: {epoch}")
    nncomm.broadcast_parameters(comm, nn.get_parameters(grad_only=False))
    nncomm.broadcast_solver_state(comm, solver)
    return epoch


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=12,
                        help="train until this epoch (resumed runs too)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="per rank")
    parser.add_argument("--maps", type=int, default=16,
                        help="feature maps of the first stage")
    parser.add_argument("--blocks", type=int, default=1,
                        help="residual blocks per stage")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0,
                        help="the test split and every epoch's shuffle")
    parser.add_argument("--overlap", action="store_true",
                        help="reduce during backward (all_reduce_callback)")
    parser.add_argument("--pack-size", type=int, default=4096,
                        help="elements per bucket with --overlap")
    parser.add_argument("--sync-bn", action="store_true",
                        help="batch normalization over every rank's batch "
                        "(PF.sync_batch_normalization)")
    parser.add_argument("--checkpoint-dir",
                        help="where rank 0 saves a checkpoint every epoch")
    parser.add_argument("--resume", type=int, nargs="?", const=LATEST,
                        metavar="EPOCH",
                        help="start from the checkpoint of EPOCH in "
                        "--checkpoint-dir (without EPOCH: the last)")
    args = parser.parse_args()
    if args.resume is not None and not args.checkpoint_dir:
        parser.error("--resume needs --checkpoint-dir")

    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()

    (x_train, y_train), (x_test, y_test) = digits(args.seed)
    x = nn.Variable((args.batch_size,) + x_train.shape[1:])
    y = nn.Variable((args.batch_size, 1))
    sync = comm if args.sync_bn else None
    logits = resnet(x, False, args.maps, args.blocks, sync)
    # Kept through forward(clear_no_need_grad=True), for the accuracy.
    logits.persistent = True
    loss = F.mean(F.softmax_cross_entropy(logits, y))
    # Each rank evaluates its slice of the test set, in one batch.
    y_shard = y_test[comm.rank::comm.size]
    test_logits = resnet(nn.Variable.from_numpy_array(
        x_test[comm.rank::comm.size]), True, args.maps, args.blocks, sync)
    test_loss = F.sum(F.softmax_cross_entropy(
        test_logits, nn.Variable.from_numpy_array(y_shard)))

    params = nn.get_parameters()
    everything = nn.get_parameters(grad_only=False)
    running_stats = [v.data for k, v in everything.items() if k not in params]
    grads = [p.grad for p in params.values()]
    solver = S.Momentum(args.lr, 0.9)
    solver.set_parameters(params)
    solver.weight_decay(1e-4)

    if args.resume is not None:
        start = load_checkpoint(comm, args.checkpoint_dir, args.resume,
                                solver)
    else:
        start = 0
        # Different seeds give different initial weights; rank 0's win.
        nncomm.broadcast_parameters(comm, everything)
    figures = evaluate(comm, test_logits, test_loss, y_shard)
    if args.resume is not None and comm.rank == 0:
        print(f"resumed at epoch {start + 1} from {args.checkpoint_dir}: "
              f"test loss {figures.loss:.6f} accuracy "
              f"{figures.accuracy:.4f}", flush=True)

    # Each rank's slice of every epoch's shuffle is at least this long.
    steps = len(x_train) // comm.size // args.batch_size
    if steps == 0:
        parser.error(f"{len(x_train)} training images cannot fill a batch "
                     f"of {args.batch_size} on each of {comm.size} ranks")
    bar = tqdm(total=(args.epochs - start) * steps, unit="step",
               disable=comm.rank != 0)
    for epoch in range(start, args.epochs):
        order = np.random.RandomState([args.seed, epoch]).permutation(
            len(x_train))[comm.rank::comm.size]
        sums = np.zeros(2)
        for step in range(steps):
            # Cosine decay, a function of the step alone, so that a
            # resumed run continues the same schedule.
            done = (epoch * steps + step) / (args.epochs * steps)
            solver.set_learning_rate(args.lr * (1 + np.cos(np.pi * done)) / 2)
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            x.d, y.d = x_train[batch], y_train[batch]
            loss.forward(clear_no_need_grad=True)
            sums += float(loss.d), np.mean(
                logits.d.argmax(axis=1) == y.d[:, 0])
            solver.zero_grad()
            if args.overlap:
                cb = comm.all_reduce_callback(grads, args.pack_size,
                                              division=True)
                loss.backward(clear_buffer=True, communicator_callbacks=cb)
            else:
                loss.backward(clear_buffer=True)
                comm.all_reduce(grads, division=True)
            solver.update()
            bar.set_postfix(loss=f"{sums[0] / (step + 1):.3f}",
                            acc=f"{sums[1] / (step + 1):.3f}", refresh=False)
            bar.update()
        comm.all_reduce(running_stats, division=True)
        train = summed(comm, *sums) / (comm.size * steps)
        figures = evaluate(comm, test_logits, test_loss, y_shard)
        if comm.rank == 0:
            bar.write(f"epoch {epoch + 1:3d}  train loss {train[0]:.4f} "
                      f"accuracy {train[1]:.4f}  test loss "
                      f"{figures.loss:.6f} accuracy {figures.accuracy:.4f}")
            if args.checkpoint_dir:
                save_checkpoint(args.checkpoint_dir, epoch + 1, solver,
                                figures)
    bar.close()

    same = parameters_match(comm, everything)
    if comm.rank == 0:
        print(f"test accuracy {figures.accuracy:.4f} ({figures.correct} of "
              f"{figures.count} digits)")
        print(f"parameter checksums {'match' if same else 'DIFFER'} across "
              f"{comm.size} ranks (running statistics included)")


if __name__ == "__main__":
    main()
