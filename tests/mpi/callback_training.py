"""Data-parallel training with all_reduce_callback equals single-process
training on the global batch, step by step, on real data.

scikit-learn's bundled digits (1797 8x8 images, 10 classes), in one fixed
shuffled order. Each step takes the next global batch of 64 images; rank r
of N trains on its 64/N-image slice with the mean cross-entropy of that
slice, the callback averaging gradients (division=True), and SGD with
momentum. In the same process, under a parameter scope of its own, the
single-process reference trains on the whole 64-image batch with a plain
backward, from the same initial parameters (rank 0's, broadcast). After
every step every parameter of the data-parallel model must equal the
reference's within float32 rounding (the two sum per-sample gradients in
a different grouping), and be bit-identical across ranks. The models must
also move far more than that tolerance, so that the comparison is not
between two frozen models.

Models: an MLP (callback created once, reused every step, pack_size 100:
several buckets) and a small conv net (a new callback every step, as
nnabla-examples do, pack_size 2 << 20). The engine's launch schedule is
timed on the first steps and settled well before the 20th, the same on
every rank; the suite also runs this with each schedule forced.
"""
import os

import numpy as np
from mpi4py import MPI
from sklearn.datasets import load_digits

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S

from _harness import Checker, env_note, make_comm, world_gather

BATCH, STEPS = 64, 20
LR, MOMENTUM = 0.1, 0.9
# Float32 rounding of the reduction order, grown over 20 steps; measured
# differences are ~3e-7 (see the report line), a missed or doubled
# reduction moves parameters by ~1e-2.
RTOL, ATOL = 1e-5, 2e-6
# AllReduceCallback.schedule: timing both on the first iterations, then one.
SCHEDULES = ("tuning", "eager", "deferred")


def digits():
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    t = d.target.astype(np.int32).reshape(-1, 1)
    order = np.random.RandomState(0).permutation(len(x))
    return x[order], t[order]


def mlp(x):
    h = F.relu(PF.affine(x, 32, name="fc1"))
    return PF.affine(h, 10, name="fc2")


def cnn(x):
    h = F.reshape(x, (x.shape[0], 1, 8, 8))
    h = F.relu(PF.convolution(h, 6, (3, 3), pad=(1, 1), name="conv"))
    h = F.max_pooling(h, (2, 2))
    return PF.affine(h, 10, name="fc")


def build(net, scope, batch):
    x, t = nn.Variable((batch, 64)), nn.Variable((batch, 1))
    with nn.parameter_scope(scope):
        loss = F.mean(F.softmax_cross_entropy(net(x), t))
        params = nn.get_parameters()
    return x, t, loss, params


def train(ck, comm, name, net, reuse, pack, data):
    X, T = data
    n, rank = comm.size, comm.rank
    local = BATCH // n
    x, t, loss, params = build(net, f"{name}/dp", local)
    X_ref, T_ref, loss_ref, params_ref = build(net, f"{name}/ref", BATCH)
    # Initial parameters drawn differently on each rank, then rank 0's
    # everywhere, the reference included.
    np.random.seed(100 + rank)
    for p in params.values():
        p.d = np.random.randn(*p.shape).astype(np.float32) * 0.3
    comm.bcast([p.data for p in params.values()], 0)
    for k, p in params.items():
        params_ref[k].d = p.d.copy()
    initial = {k: p.d.copy() for k, p in params.items()}

    solver, solver_ref = (S.Momentum(LR, MOMENTUM),
                          S.Momentum(LR, MOMENTUM))
    solver.set_parameters(params)
    solver_ref.set_parameters(params_ref)
    grads = [p.grad for p in params.values()]
    once = comm.all_reduce_callback(grads, pack, division=True) \
        if reuse else None
    worst = 0.0
    for step in range(STEPS):
        lo = (step * BATCH) % (len(X) - BATCH)
        xb, tb = X[lo:lo + BATCH], T[lo:lo + BATCH]
        X_ref.d, T_ref.d = xb, tb
        loss_ref.forward()
        solver_ref.zero_grad()
        loss_ref.backward()
        solver_ref.update()

        x.d, t.d = xb[rank * local:(rank + 1) * local], \
            tb[rank * local:(rank + 1) * local]
        loss.forward(clear_no_need_grad=True)
        solver.zero_grad()
        cb = once if reuse else comm.all_reduce_callback(grads, pack,
                                                         division=True)
        loss.backward(clear_buffer=True, function_post_hook=cb)
        solver.update()

        what = f"{name} on {n} ranks, step {step + 1}"
        for k, p in params.items():
            ref = params_ref[k].d.astype(np.float64)
            tol = ATOL + RTOL * np.abs(ref)
            ck.array(p.data, ref, f"{what}: {k} equals single-process "
                     f"training", np.float32, tol)
            worst = max(worst, float(np.max(np.abs(p.d - ref))))
        everyone = world_gather([p.data for p in params.values()])
        ck.true(all(np.array_equal(a, b) for mine in everyone
                    for a, b in zip(mine, everyone[0])),
                f"{what}: parameters bit-identical on every rank")
        schedules = MPI.COMM_WORLD.allgather(cb.schedule)
        ck.true(len(set(schedules)) == 1 and schedules[0] in SCHEDULES,
                f"{what}: one launch schedule on every rank ({schedules})")
    forced = os.environ.get("NNCOMM_LAUNCH")
    ck.true(cb.schedule == forced if forced in SCHEDULES else
            cb.schedule in SCHEDULES[1:],
            f"{name}: the launch schedule is settled after {STEPS} steps "
            f"({cb.schedule}, NNCOMM_LAUNCH={forced})")
    moved = max(float(np.max(np.abs(p.d - initial[k])))
                for k, p in params.items())
    ck.true(moved > 1000 * ATOL, f"{name}: training moved the parameters "
            f"(by {moved:.3g}) far beyond the tolerance")
    return worst, moved


def main():
    ck = Checker("callback_training")
    comm, _ = make_comm()
    data = digits()
    ck.equal(data[0].shape, (1797, 64), "premise: load_digits' images")
    notes = []
    for name, net, reuse, pack in (("mlp", mlp, True, 100),
                                   ("cnn", cnn, False, 2 << 20)):
        worst, moved = train(ck, comm, name, net, reuse, pack, data)
        notes.append(f"{name}: max |dp - ref| {worst:.2g}, moved {moved:.2g}")
    if comm.rank == 0:
        print("; ".join(notes + [env_note()]), flush=True)
    ck.finish()


main()
