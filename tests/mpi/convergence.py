"""Convergence on scikit-learn's digits: the training layer's schemes
reach plain data-parallel training's test accuracy.

Every scheme trains the same 64-64-10 MLP from the same start for the same
number of steps, each rank on its slice of every global batch, and its test
accuracy is compared with plain data parallel's (DistributedSolver without
compression). Schemes that change what the ranks exchange must land
within 2 points of it; a scheme that is known to be broken (1-bit without
error feedback) must be measurably worse, which shows the test can tell.
"""
import time

import numpy as np
from sklearn.datasets import load_digits

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S

import nncomm

from _harness import Checker, make_comm

BATCH, STEPS, TEST = 64, 600, 360
LR, MOMENTUM = 0.05, 0.9
WITHIN = 0.02  # accuracy points a scheme may lose against plain


def digits():
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    t = d.target.astype(np.int32).reshape(-1, 1)
    order = np.random.RandomState(0).permutation(len(x))
    x, t = x[order], t[order]
    return (x[TEST:], t[TEST:]), (x[:TEST], t[:TEST])


def model(scope, batch):
    x, t = nn.Variable((batch, 64)), nn.Variable((batch, 1))
    with nn.parameter_scope(scope):
        h = F.relu(PF.affine(x, 64, name="fc1"))
        y = PF.affine(h, 10, name="fc2")
        params = nn.get_parameters()
    return x, t, y, F.mean(F.softmax_cross_entropy(y, t)), params


def train(comm, scheme, make, data):
    """Test accuracy on this rank after STEPS steps of `make`'s solver."""
    (X, T), (Xt, Tt) = data
    shard = BATCH // comm.size
    np.random.seed(0)  # the same start everywhere, whatever the scheme
    x, t, _, loss, params = model(scheme, shard)
    solver = make(comm)
    solver.set_parameters(params)
    rng = np.random.RandomState(1)
    for _ in range(STEPS):
        rows = rng.randint(0, len(X), BATCH)
        mine = rows[comm.rank * shard:(comm.rank + 1) * shard]
        x.d, t.d = X[mine], T[mine]
        loss.forward()
        solver.zero_grad()
        solver.backward(loss, clear_buffer=True)
        solver.update()
    xt, _, yt, _, _ = model(scheme, len(Xt))
    xt.d = Xt
    yt.forward()
    return float(np.mean(yt.d.argmax(axis=1) == Tt[:, 0]))


def plain(comm):
    return nncomm.DistributedSolver(S.Momentum(LR, MOMENTUM), comm)


# name -> (solver maker, whether it must stay within WITHIN of plain)
SCHEMES = {
    "plain": (plain, True),
    "fp16": (lambda comm: nncomm.DistributedSolver(
        S.Momentum(LR, MOMENTUM), comm,
        compression=nncomm.Compression.fp16), True),
    "warm start 25%": (lambda comm: nncomm.DistributedSolver(
        S.Momentum(LR, MOMENTUM), comm,
        distributed_after=STEPS // 4 * BATCH // comm.size), True),
    "1-bit": (lambda comm: nncomm.data_parallel_solver(
        S.Momentum(LR, MOMENTUM), comm, num_quantization_bits=1), True),
    "8-bit": (lambda comm: nncomm.data_parallel_solver(
        S.Momentum(LR, MOMENTUM), comm, num_quantization_bits=8), True),
    "1-bit without error feedback": (lambda comm: nncomm.DistributedSolver(
        S.Momentum(LR, MOMENTUM), comm,
        compression=nncomm.Compression.quantized(1, error_feedback=False)),
        False),
    # block_size counts the group's samples: a sync every 4 steps.
    "BMUF 4 steps": (lambda comm: nncomm.block_momentum_solver(
        S.Momentum(LR, MOMENTUM), comm, block_size=4 * BATCH), True),
    "BMUF 4 steps, warm start 25%": (
        lambda comm: nncomm.block_momentum_solver(
            S.Momentum(LR, MOMENTUM), comm, block_size=4 * BATCH,
            distributed_after=STEPS // 4 * BATCH // comm.size), True),
}


def main():
    ck = Checker("convergence")
    comm, _ = make_comm()
    data = digits()
    accuracy, seconds = {}, {}
    for scheme, (make, close) in SCHEMES.items():
        start = time.perf_counter()
        accuracy[scheme] = train(comm, scheme, make, data)
        seconds[scheme] = time.perf_counter() - start
    everyone = nncomm.allgather_object(comm, accuracy)
    for scheme, (_, close) in SCHEMES.items():
        got = accuracy[scheme]
        ck.true(all(a[scheme] == got for a in everyone),
                f"{scheme}: the same model on every rank",
                f"accuracies {[a[scheme] for a in everyone]}")
        if close:
            ck.true(got >= accuracy["plain"] - WITHIN,
                    f"{scheme}: within {WITHIN:.0%} of plain",
                    f"{got:.3f} vs {accuracy['plain']:.3f}")
        else:
            ck.true(got < accuracy["plain"] - WITHIN,
                    f"{scheme}: measurably worse than plain",
                    f"{got:.3f} vs {accuracy['plain']:.3f}")
    ck.true(accuracy["plain"] > 0.93, "plain learns digits",
            f"{accuracy['plain']:.3f}")
    if comm.rank == 0:
        print("convergence: test accuracy after", STEPS, "steps: " + ", ".join(
            f"{s} {a:.3f} ({seconds[s]:.1f} s)" for s, a in accuracy.items()))
    ck.finish()


main()
