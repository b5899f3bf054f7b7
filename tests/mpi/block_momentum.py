"""BlockMomentumSolver: N ranks against an in-process reference of BMUF.

Each case trains the 6-9-8-2 tanh MLP on every rank of a group, each rank
on its own batches, starting from different initial weights (set_parameters
must make them the group's first rank's). Beside it, every rank simulates
the whole group in-process: every rank's model trained alone by its own
copy of the solver, and at each synchronization BMUF applied to them in
numpy, written out from CNTK's BlockMomentumDistributedLearner:

    G = sum_r (w - w_r), m = exp(-n / tau) (0 where tau is 0),
    Delta = m Delta + (1 - m) eta G, w -= Delta (and m Delta with Nesterov),
    every model set to w, every solver state array zeroed with the reset,

n being the samples the group trained in the block, tau by default
-block_size / ln(1 - 1/N). A rank synchronizes at the first update where
its count reaches block_size // N, and the next block counts from 0. This
rank's parameters and solver state must match its simulated ones after
every update, to float32 rounding.

Cases, each over three blocks or more: the defaults (Nesterov, reset,
default time constant), without Nesterov, without the reset, a given time
constant with a block learning rate of 0.8, a block_size that is a multiple
of neither the batch nor the group's size, Adam (both moments reset, t
kept), batches of different sizes on different ranks (the momentum from
the group's sum of samples), two backward passes per update with
num_samples given, the warm start (distributed_after), a sub-group; misuse
raising, on every rank where the call is collective.
"""
import math

import numpy as np

import nnabla as nn
import nnabla.solvers as S

import nncomm

from _harness import Checker, make_comm, mlp

TOL = 2e-5


def data(step, rank, rows):
    """Rank `rank`'s input and target at `step`."""
    rng = np.random.default_rng(1000 * step + rank)
    return (rng.standard_normal((rows, 6)).astype(np.float32),
            rng.standard_normal((rows, 2)).astype(np.float32))


def train(x, t, loss, solver, step, rank, passes, count):
    """One local step of `rank`: `passes` backward passes on halves of its
    batch (through `solver.backward`, counting `count` samples each, when
    `solver` is the wrapper), then the update."""
    xs, ts = data(step, rank, x.shape[0] * passes)
    solver.zero_grad()
    for p in range(passes):
        rows = slice(p * x.shape[0], (p + 1) * x.shape[0])
        x.d, t.d = xs[rows], ts[rows]
        loss.forward()
        if isinstance(solver, nncomm.BlockMomentumSolver):
            solver.backward(loss, clear_buffer=True, num_samples=count)
        else:
            loss.backward(clear_buffer=True)
    solver.update()


class Group:
    """The group simulated in one process: each rank's model and solver,
    the block's start w and the block-level update Delta, in float64."""

    def __init__(self, rows, make_solver, start, options):
        size = len(rows)
        self.models, self.solvers = [], []
        for r in range(size):
            x, t, loss, params = mlp(f"sim{r}", rows[r], 0)
            for name, v in params.items():
                v.d = start[name]
            solver = make_solver()
            solver.set_parameters(params)
            self.models.append((x, t, loss, params))
            self.solvers.append(solver)
        self.size = size
        self.names = sorted(start)
        self.w = {k: start[k].astype(np.float64) for k in self.names}
        self.delta = {k: np.zeros(start[k].shape) for k in self.names}
        block = options["block_size"]
        tau = options.get("block_momentum_as_time_constant")
        if tau is None:
            tau = 0.0 if size == 1 else -block / math.log(1 - 1 / size)
        self.tau = tau
        self.period = block // size
        self.nesterov = options.get("use_nesterov_momentum", True)
        self.reset = options.get("reset_sgd_momentum_after_aggregation",
                                 True)
        self.rate = options.get("block_learning_rate", 1.0)
        self.in_block = [0] * size  # each rank's samples in the block

    def step(self, step, passes, counted):
        """Every rank's update at `step`, counting `counted[r]` samples."""
        for r, ((x, t, loss, _), solver) in enumerate(
                zip(self.models, self.solvers)):
            train(x, t, loss, solver, step, r, passes, None)
        self.in_block = [c + k for c, k in zip(self.in_block, counted)]

    def average(self):
        """The end of the warm start: every model and solver state set to
        the group's mean, which the first block starts from."""
        for k in self.names:
            mean = np.mean([p[k].d for _, _, _, p in self.models], axis=0)
            self.w[k] = mean.astype(np.float64)
        states = [s.get_states() for s in self.solvers]
        for name in states[0]:
            for key in states[0][name].pstate:
                mean = np.mean([s[name].pstate[key].d for s in states],
                               axis=0)
                for s in states:
                    s[name].pstate[key].d = mean
        self.set_models()
        self.in_block = [0] * self.size

    def synchronize(self):
        n = sum(self.in_block)
        m = math.exp(-n / self.tau) if self.tau else 0.0
        for k in self.names:
            g = sum(self.w[k] - p[k].d for _, _, _, p in self.models)
            self.delta[k] = m * self.delta[k] + (1 - m) * self.rate * g
            self.w[k] = self.w[k] - self.delta[k]
            if self.nesterov:
                self.w[k] = self.w[k] - m * self.delta[k]
        self.set_models()
        if self.reset:
            for solver in self.solvers:
                for state in solver.get_states().values():
                    for v in state.pstate.values():
                        v.d = 0
        self.in_block = [0] * self.size

    def set_models(self):
        for _, _, _, params in self.models:
            for k in self.names:
                params[k].d = self.w[k]


def run(ck, comm, what, make_solver, options, batch=4, steps=7,
        warm_steps=0, passes=1, count=None, group="world", factory=False):
    """`what`: `steps` updates of batch `batch` (an int, or a function of
    the group rank) per rank after `warm_steps` alone; `options` as
    BlockMomentumSolver takes them, with `block_size` a function of the
    group's size; `count`: num_samples per pass (None: counted from the
    graph)."""
    ranks = comm.find_group(group)
    if comm.rank not in ranks:
        return
    size, me = len(ranks), ranks.index(comm.rank)
    options = dict(options, block_size=options["block_size"](size))
    rows = [(batch(r) if callable(batch) else batch) // passes
            for r in range(size)]
    counted = [(k if count is None else count) * passes for k in rows]
    nn.clear_parameters()
    x, t, loss, params = mlp("bmuf", rows[me], comm.rank)
    make = nncomm.block_momentum_solver if factory else \
        nncomm.BlockMomentumSolver
    solver = make(make_solver(), comm, group=group,
                  distributed_after=warm_steps * counted[me], **options)
    solver.set_parameters(params)
    sim = Group(rows, make_solver,
                {k: v.d.copy() for k, v in params.items()}, options)
    syncs = 0
    for step in range(warm_steps + steps):
        train(x, t, loss, solver, step, me, passes, count)
        sim.step(step, passes, counted)
        reached = [c >= sim.period for c in sim.in_block]
        if step + 1 == warm_steps:
            sim.average()
        elif step >= warm_steps and any(reached):
            # Otherwise the ranks' all-reduces would pair out of step,
            # which the reference does not follow.
            ck.true(all(reached), f"{what}: step {step}: the case ends "
                    f"every rank's block at the same update")
            sim.synchronize()
            syncs += 1
        at = f"{what}: step {step}"
        mine = sim.models[me][3]
        for name, v in params.items():
            close(ck, v.d, mine[name].d, f"{at} {name}")
        states, expected = solver.get_states(), sim.solvers[me].get_states()
        for name, state in states.items():
            ck.equal(state.t, expected[name].t, f"{at} {name} t")
            for key, v in state.pstate.items():
                close(ck, v.d, expected[name].pstate[key].d,
                      f"{at} {name} state {key}")
    ck.true(syncs >= 3, f"{what}: three blocks or more", f"{syncs}")


def close(ck, got, expected, what):
    ck.true(np.allclose(got, expected, rtol=TOL, atol=TOL / 20), what,
            f"max difference {np.max(np.abs(got - expected)):.3g}")


def misuse(ck, comm):
    nn.clear_parameters()
    x, t, loss, params = mlp("misuse", 4, comm.rank)
    x.d, t.d = np.ones(x.shape), np.zeros(t.shape)
    n = comm.size
    make = nncomm.BlockMomentumSolver
    for bad, exc, match in (("8", TypeError, "must be an int"),
                            (2.5, TypeError, "must be an int"),
                            (True, TypeError, "must be an int"),
                            (0, ValueError, f"give {n} or more"),
                            (-4, ValueError, f"give {n} or more"),
                            (n - 1, ValueError, "leaves each rank none")):
        ck.raises(exc, match, f"block_size {bad!r}", make, S.Sgd(0.1), comm,
                  bad)
    for bad, exc, match in ((-1.0, ValueError, "0 or more and finite"),
                            (math.inf, ValueError, "0 or more and finite"),
                            ("3", TypeError, "must be a number")):
        ck.raises(exc, match, f"time constant {bad!r}", make, S.Sgd(0.1),
                  comm, 8 * n, block_momentum_as_time_constant=bad)
    for bad in (0, -1.0, math.nan):
        ck.raises(ValueError, "positive and finite",
                  f"block learning rate {bad!r}", make, S.Sgd(0.1), comm,
                  8 * n, block_learning_rate=bad)
    ck.raises(TypeError, "use_nesterov_momentum must be a bool",
              "Nesterov as 1", make, S.Sgd(0.1), comm, 8 * n,
              use_nesterov_momentum=1)
    ck.raises(TypeError, "reset_sgd_momentum_after_aggregation",
              "reset as None", make, S.Sgd(0.1), comm, 8 * n,
              reset_sgd_momentum_after_aggregation=None)
    ck.raises(ValueError, "non-negative", "distributed_after -1", make,
              S.Sgd(0.1), comm, 8 * n, distributed_after=-1)
    if n >= 2:
        comm.new_group(("bmuf_first", [0]))
        if comm.rank != 0:
            ck.raises(ValueError, "not in group", "a group without this rank",
                      make, S.Sgd(0.1), comm, 8, group="bmuf_first")
        # Settings that differ between ranks: every rank raises, before any
        # parameter is sent.
        for what, options, match in (
                ("block_size", {"block_size": 8 * n + comm.rank},
                 "block_size"),
                ("time constant", {"block_size": 8 * n,
                                   "block_momentum_as_time_constant":
                                   10.0 if comm.rank else None},
                 "group rank 1 10.0"),
                ("Nesterov", {"block_size": 8 * n,
                              "use_nesterov_momentum": comm.rank == 0},
                 "use_nesterov_momentum")):
            differing = make(S.Sgd(0.1), comm, **options)
            ck.raises(ValueError, match, f"{what} differs between ranks",
                      differing.set_parameters, params)
    solver = make(S.Sgd(0.1), comm, 8 * n)
    loss.forward()
    ck.raises(RuntimeError, "set_parameters", "backward first",
              solver.backward, loss)
    solver.set_parameters(params)
    ck.raises(RuntimeError, "no backward()", "update first", solver.update)
    ck.raises(ValueError, "must not be negative", "num_samples -1",
              solver.backward, loss, num_samples=-1)
    ck.raises(TypeError, "num_samples must be an int", "num_samples 2.5",
              solver.backward, loss, num_samples=2.5)
    solver.backward(loss)
    solver.zero_grad()
    ck.raises(RuntimeError, "no backward()", "update after zero_grad",
              solver.update)
    solver.set_learning_rate(0.5)
    ck.equal(solver.learning_rate(), 0.5, "methods pass through")


def main():
    ck = Checker("block_momentum")
    comm, _ = make_comm()

    def momentum():
        return S.Momentum(0.05, 0.9)

    every2 = {"block_size": lambda n: 8 * n}  # batch 4: every 2 updates
    run(ck, comm, "defaults", momentum, every2)
    run(ck, comm, "without Nesterov", momentum,
        dict(every2, use_nesterov_momentum=False))
    run(ck, comm, "without the reset", momentum,
        dict(every2, reset_sgd_momentum_after_aggregation=False))
    run(ck, comm, "time constant 30, block learning rate 0.8", momentum,
        dict(every2, block_momentum_as_time_constant=30.0,
             block_learning_rate=0.8), factory=True)
    # 8 samples per rank (9N - 1 over N ranks); batch 3 reaches 9 at the
    # third update, and the excess sample is dropped.
    run(ck, comm, "block_size a multiple of neither batch nor N", momentum,
        {"block_size": lambda n: 9 * n - 1}, batch=3, steps=10)
    run(ck, comm, "Adam", lambda: S.Adam(0.01), every2)
    # Batches of 4 and 5 by turns: the ranks synchronize at the second
    # update with 8 and 10 samples; every rank takes the group's sum.
    run(ck, comm, "batches differing between ranks", momentum, every2,
        batch=lambda r: 4 + r % 2)
    # Two passes of 2 rows, 3 samples each as the caller counts them: 6 per
    # update, so that 8 are reached at the second.
    run(ck, comm, "2 passes, num_samples", momentum, every2, passes=2,
        count=3)
    run(ck, comm, "2 updates alone first", momentum, every2, warm_steps=2)
    if comm.size >= 2:
        pair = [comm.size - 1, 0]
        comm.new_group(("pair", pair))
        run(ck, comm, "Sgd on a pair", lambda: S.Sgd(0.1),
            dict(every2, block_momentum_as_time_constant=20.0),
            group="pair")
    misuse(ck, comm)
    ck.finish()


main()
