"""comm.join(): ranks with different numbers of batches.

Rank r trains STEPS[n][r] steps of the 6-9-8-2 MLP inside ``comm.join``;
its batch at step s is a pure function of (r, s), so every rank also runs,
in-process, the reference schedule: at step s the ranks that still have
data each compute their gradient, and the average divides their sum by the
world size (the ranks that left add zeros) or, with
``divide_by_initial_world_size=False``, by their number. At the end every
rank must hold the reference's parameters and solver state (the last rank
to train's). In the loop, metrics go through list collectives whose
results are exact: an all_reduce of (rank + 1), an all_gather of the rank
(zeros from the ranks that left) and a broadcast from the rank that trains
longest.

The callback modes train two epochs, each in a join scope of its own, the
second with the ranks' step counts rotated.

Modes (argv[1]):
  callback     all_reduce_callback through function_post_hook, Momentum
  cc           the same callback through nnabla's communicator_callbacks=
  active       callback, divide_by_initial_world_size=False
  solver       DistributedSolver, Adam, backward_passes_per_step=2
  fp16         DistributedSolver, Compression.fp16 (16-bit tolerance)
  quantized    DistributedSolver, Compression.quantized(8) (8-bit tolerance)
  bmuf         BlockMomentumSolver, blocks of 2 steps' samples
  throw        throw_on_early_termination: every rank raises together
  throw_cc     the same through communicator_callbacks=
  bcast_left   a broadcast rooted at a rank that left (every rank raises)
  raise        a rank raises inside the join (the others raise, naming it)
"""
import sys

import numpy as np

import nnabla as nn
import nnabla.solvers as S

import nncomm
from mpi4py import MPI

from _harness import Checker, make_comm, mlp, nd

STEPS = {1: [3], 2: [4, 2], 3: [4, 2, 5], 4: [3, 5, 1, 4]}
BATCH = 4
SOLVERS = ("solver", "fp16", "quantized")
COMPRESSION = {"fp16": nncomm.Compression.fp16,
               "quantized": nncomm.Compression.quantized(
                   8, error_feedback=False)}


def schedule(n, epoch):
    """Steps of each rank in `epoch`: the second epoch's are rotated, so
    another rank trains longest."""
    return STEPS[n][epoch:] + STEPS[n][:epoch]


def epochs(mode):
    """Join scopes one after the other: two in the callback modes."""
    return 2 if mode in ("callback", "cc") else 1


def batch(rank, step):
    rng = np.random.RandomState(1000 * rank + step)
    return rng.randn(BATCH, 6), rng.randn(BATCH, 2)


def make_solver(mode):
    return S.Adam(0.01) if mode in SOLVERS else \
        S.Momentum(0.1, 0.9)


def gradients(x, t, loss, params, data, passes):
    """The gradients of `loss` on `data`, summed over `passes` halves."""
    xs, ts = data
    total = [np.zeros(p.shape, np.float32) for p in params.values()]
    for half in range(passes):
        rows = slice(half * BATCH // passes, (half + 1) * BATCH // passes)
        x.d, t.d = np.resize(xs[rows], x.shape), np.resize(ts[rows], t.shape)
        loss.forward()
        for p in params.values():
            p.grad.zero()
        loss.backward()
        for g, p in zip(total, params.values()):
            g += p.g
    return total


def reference(mode, n, divide_by_initial, steps, start):
    """The schedule in one process from parameters `start`: its parameters
    and solver."""
    passes = 2 if mode in SOLVERS else 1
    x, t, loss, params = mlp("reference", BATCH // passes, 7)
    for p, value in zip(params.values(), start):
        p.d = value
    solver = make_solver(mode)
    solver.set_parameters(params)
    for e in range(epochs(mode)):
        for s in range(steps if steps is not None
                       else max(schedule(n, e))):
            active = [r for r in range(n) if schedule(n, e)[r] > s]
            grads = [gradients(x, t, loss, params, batch(r, s), passes)
                     for r in active]
            divisor = n if divide_by_initial else len(active)
            for i, p in enumerate(params.values()):
                p.g = sum(g[i] for g in grads) / divisor
            solver.update()
    return params, solver


def metrics(comm, ck, n, s, steps):
    """List collectives a training loop makes: exact results."""
    active = [r for r in range(n) if steps[r] > s]
    total = nd(np.full(3, comm.rank + 1, np.float32))
    comm.all_reduce([total], division=False)
    ck.array(total, np.full(3, sum(r + 1 for r in active), np.float32),
             f"step {s}: all_reduce of rank+1 over the ranks training")
    gathered = [nd(np.zeros(2, np.int32)) for _ in range(n)]
    comm.all_gather(nd(np.full(2, comm.rank, np.int32)), gathered)
    for r in range(n):
        ck.array(gathered[r], np.full(2, r if r in active else 0, np.int32),
                 f"step {s}: all_gather block of rank {r}")
    longest = int(np.argmax(steps))
    sent = nd(np.full(4, 100 + s, np.float64) if comm.rank == longest
              else np.zeros(4))
    comm.bcast([sent], longest)
    ck.array(sent, np.full(4, 100 + s, np.float64),
             f"step {s}: bcast from the rank training longest")


def train(comm, ck, mode, n):
    divide_by_initial = mode != "active"
    passes = 2 if mode in SOLVERS else 1
    x, t, loss, params = mlp("net", BATCH // passes, 7)
    grads = [p.grad for p in params.values()]
    if mode in SOLVERS:
        solver = nncomm.DistributedSolver(
            make_solver(mode), comm, backward_passes_per_step=2,
            compression=COMPRESSION.get(mode, nncomm.Compression.none),
            pack_size=40)
    elif mode == "bmuf":
        solver = nncomm.BlockMomentumSolver(make_solver(mode), comm,
                                            block_size=2 * BATCH * n)
    else:
        solver = make_solver(mode)
    solver.set_parameters(params)
    start = [p.d.copy() for p in params.values()]
    cb = comm.all_reduce_callback(grads, 40, division=True)
    raised = None
    for e in range(epochs(mode)):
        raised, join = train_epoch(comm, ck, mode, n, e, x, t, loss, solver,
                                   cb, divide_by_initial, passes)
    return params, solver, raised, join, start


def train_epoch(comm, ck, mode, n, epoch, x, t, loss, solver, cb,
                divide_by_initial, passes):
    """One join scope: (InputsExhaustedError raised or None, the Join)."""
    steps = schedule(n, epoch)
    raised = None
    try:
        with comm.join([solver], divide_by_initial_world_size=(
                divide_by_initial),
                throw_on_early_termination=mode.startswith("throw")) as join:
            for s in range(steps[comm.rank]):
                xs, ts = batch(comm.rank, s)
                if mode in SOLVERS:
                    solver.zero_grad()
                    for half in range(passes):
                        rows = slice(half * BATCH // passes,
                                     (half + 1) * BATCH // passes)
                        x.d, t.d = xs[rows], ts[rows]
                        loss.forward()
                        solver.backward(loss)
                elif mode == "bmuf":
                    x.d, t.d = xs, ts
                    loss.forward()
                    solver.zero_grad()
                    solver.backward(loss)
                else:
                    x.d, t.d = xs, ts
                    loss.forward()
                    solver.zero_grad()
                    if mode in ("cc", "throw_cc"):
                        loss.backward(communicator_callbacks=cb)
                    else:
                        loss.backward(function_post_hook=cb)
                solver.update()
                if mode != "bmuf":
                    metrics(comm, ck, n, s, steps)
    except nncomm.InputsExhaustedError as e:
        raised = e
    return raised, join


def compare(ck, mode, n, params, solver, start):
    """Parameters and solver state against the reference schedule."""
    steps = min(STEPS[n]) if mode.startswith("throw") else None
    ref_params, ref_solver = reference(mode, n, mode != "active", steps,
                                       start)
    tol = {"fp16": 2e-2, "quantized": 5e-2}.get(mode, 1e-5)
    for (name, p), r in zip(params.items(), ref_params.values()):
        ck.true(np.allclose(p.d, r.d, rtol=tol, atol=tol),
                f"{mode}: parameter {name} after the join",
                f"max difference {np.abs(p.d - r.d).max()}")
    if mode == "bmuf":
        return
    nnabla_solver = getattr(solver, "solver", solver)
    got, want = nnabla_solver.get_states(), ref_solver.get_states()
    for (name, g), w in zip(got.items(), want.values()):
        ck.equal(g.t, w.t, f"{mode}: solver step count of {name}")
        for key in g.pstate:
            ck.true(np.allclose(g.pstate[key].d, w.pstate[key].d, rtol=tol,
                                atol=tol),
                    f"{mode}: solver state {key} of {name}")


def main():
    mode = sys.argv[1]
    comm, _ = make_comm()
    n = comm.size
    ck = Checker("join")
    if mode == "bcast_left":
        # World rank 1 leaves after 1 step; the others broadcast from it.
        with comm.join([]):
            for s in range(1 if comm.rank == 1 else 3):
                comm.bcast([nd(np.zeros(2))], 1)
        return
    if mode == "raise":
        with comm.join([]):
            for s in range(3):
                if comm.rank == 1 and s == 1:
                    raise ValueError("a bad batch on rank 1")
                comm.all_reduce([nd(np.ones(2))])
        return
    params, solver, raised, join, start = train(comm, ck, mode, n)
    if mode.startswith("throw") and n > 1 and min(STEPS[n]) < max(STEPS[n]):
        ck.true(raised is not None, "throw: InputsExhaustedError on every "
                "rank")
    else:
        ck.true(raised is None, f"{mode}: no exception", repr(raised))
        ck.equal(join.last_rank,
                 int(np.argmax(schedule(n, epochs(mode) - 1))),
                 f"{mode}: the rank that trained last")
    if mode == "bmuf":
        # The model in the blocks' formula: every rank holds the same.
        mine = np.concatenate([p.d.ravel() for p in params.values()])
        everyone = MPI.COMM_WORLD.allgather(mine)
        ck.true(all(np.array_equal(mine, o) for o in everyone),
                "bmuf: every rank holds the same parameters after the join")
    else:
        compare(ck, mode, n, params, solver, start)
    # After the join every rank communicates as before.
    after = nd(np.ones(5))
    comm.all_reduce([after], division=False)
    ck.array(after, np.full(5, n, np.float64), "an all_reduce after the join")
    ck.finish()


if __name__ == "__main__":
    main()
