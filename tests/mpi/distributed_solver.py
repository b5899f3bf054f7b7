"""DistributedSolver: N ranks at batch B/N step as one process at batch B.

Each case trains a 6-9-8-2 tanh MLP for 5 steps on every rank of a group,
each rank on its slice of a global batch of 24 drawn the same everywhere,
and beside it, on every rank, a reference: the same model and solver in
one process on the whole batch (its loss scaled so that its gradient is
what the ranks' reduction should give). The ranks start from different
initial weights: set_parameters must make them rank 0's, which the
reference then starts from. Parameters must match the reference to float32
rounding after every step.

Cases: op average and sum, Momentum and Adam, fp16 and bf16 compression
(to 16-bit precision), backward_passes_per_step 2
(two passes on halves of the slice), a sub-group, a user hook chained,
gradient_predivide_factor, groups (an int and by hand), BytePS's
priority="forward" (in buckets small enough to be ordered), and the warm
start (distributed_after: the reference trains each rank's model alone
in-process first, then averages parameters and solver states);
misuse raising before any communication: update() without the reducing
backward, too many passes, a bad op, backward before set_parameters.

Graphs on which the graph analysis mispredicts the end of backward (the
user's hook turns an intermediate's need_grad on or off once the analysis
is made): the solver ends the backward when it returns, so every gradient
is, bit for bit, comm.all_reduce of a plain backward's, whether functions
ran after the one the analysis expected last or the expected ones never
ran; a function it did not expect that writes a gradient already reduced
raises on every rank instead. A function that raises in backward on one
rank (no hook sees it) makes every rank's backward raise, and the next
step is correct.
"""
import warnings

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context

import nncomm

from _harness import (Checker, GradientWriter, contribution, exception_chain,
                      make_comm, mlp, nd, placed)

BATCH = 24
STEPS = 5


def batch(step):
    rng = np.random.default_rng(100 + step)
    return (rng.standard_normal((BATCH, 6)).astype(np.float32),
            rng.standard_normal((BATCH, 2)).astype(np.float32))


def run(ck, comm, what, make_solver, op="average", passes=1,
        group="world", compression=nncomm.Compression.none, tol=2e-5,
        warm_steps=0, groups=None, **options):
    if placed(comm, group) is None:
        return
    size, me = placed(comm, group)
    nn.clear_parameters()
    shard = BATCH // size // passes
    total = op == "sum"
    x, t, loss, params = mlp("dist", shard, comm.rank, total)
    if callable(groups):
        groups = groups(params)
    solver = nncomm.DistributedSolver(
        make_solver(), comm, compression=compression, op=op,
        backward_passes_per_step=passes, group=group, groups=groups,
        distributed_after=warm_steps * shard * passes, **options)
    solver.set_parameters(params)
    rx, rt, rloss, rparams = mlp("ref", BATCH, 0, total)
    for name, v in params.items():
        rparams[name].d = v.d
    reference = make_solver()
    reference.set_parameters(rparams)
    if warm_steps:
        alone(make_solver, params, reference, size, shard * passes,
              passes, warm_steps)
    # Averaging over the ranks of sums over `passes` slices gives `passes`
    # times the batch mean.
    scale = passes if op == "average" else 1
    rscaled = rloss * scale
    calls = []
    for step in range(STEPS):
        xs, ts = batch(step)
        solver.zero_grad()
        for p in range(passes):
            rows = slice((me * passes + p) * shard,
                         (me * passes + p + 1) * shard)
            x.d, t.d = xs[rows], ts[rows]
            loss.forward()
            solver.backward(loss, clear_buffer=True,
                            function_post_hook=calls.append)
        solver.update()
        if step < warm_steps:
            continue  # `alone` computed where the warm start ends
        rx.d, rt.d = xs, ts
        rscaled.forward()
        reference.zero_grad()
        rscaled.backward(clear_buffer=True)
        reference.update()
        for name, v in params.items():
            ck.true(np.allclose(v.d, rparams[name].d, rtol=tol,
                                atol=tol / 20),
                    f"{what}: step {step} {name}",
                    f"max difference "
                    f"{np.max(np.abs(v.d - rparams[name].d)):.3g}")
    ck.true(len(calls) > 0, f"{what}: the user's hook ran")


def alone(make_solver, params, reference, size, shard, passes, steps):
    """The warm start in one process: each rank's model (from the shared
    start) trained alone on its slice for `steps` steps (`passes` times
    the mean gradient, as its passes accumulate), then the mean of their
    parameters and solver states put into `reference`."""
    models = []
    for r in range(size):
        x, t, loss, local = mlp(f"alone{r}", shard, 0, False)
        loss = loss * passes
        for name, v in params.items():
            local[name].d = v.d
        solver = make_solver()
        solver.set_parameters(local)
        for step in range(steps):
            xs, ts = batch(step)
            x.d, t.d = xs[r * shard:(r + 1) * shard], \
                ts[r * shard:(r + 1) * shard]
            loss.forward()
            solver.zero_grad()
            loss.backward(clear_buffer=True)
            solver.update()
        models.append((local, solver.get_states()))
    for name, v in reference.get_parameters().items():
        v.d = np.mean([local[name].d for local, _ in models], axis=0)
    states = reference.get_states()
    for name, state in states.items():
        state.t = models[0][1][name].t
        for key, v in state.pstate.items():
            v.d = np.mean([s[name].pstate[key].d for _, s in models],
                          axis=0)
    reference.set_states(states)


def misuse(ck, comm):
    nn.clear_parameters()
    x, t, loss, params = mlp("misuse", 4, 1, False)
    x.d, t.d = np.ones(x.shape), np.zeros(t.shape)
    ck.raises(ValueError, "op must be", "op max",
              nncomm.DistributedSolver, S.Sgd(0.1), comm, op="max")
    ck.raises(TypeError, "Compression", "compression as a string",
              nncomm.DistributedSolver, S.Sgd(0.1), comm, compression="fp16")
    ck.raises(ValueError, "positive", "no passes",
              nncomm.DistributedSolver, S.Sgd(0.1), comm,
              backward_passes_per_step=0)
    ck.raises(ValueError, "needs op='average'", "predivide with sum",
              nncomm.DistributedSolver, S.Sgd(0.1), comm, op="sum",
              gradient_predivide_factor=2)
    ck.raises(ValueError, "must be positive", "predivide 0",
              nncomm.DistributedSolver, S.Sgd(0.1), comm,
              gradient_predivide_factor=0)
    ck.raises(ValueError, "groups must be", "groups 0",
              nncomm.DistributedSolver, S.Sgd(0.1), comm, groups=0)
    ck.raises(ValueError, "non-negative", "distributed_after -1",
              nncomm.DistributedSolver, S.Sgd(0.1), comm,
              distributed_after=-1)
    ck.raises(ValueError, "priority must be", "priority backward",
              nncomm.DistributedSolver, S.Sgd(0.1), comm,
              priority="backward")
    ck.raises(ValueError, "after it", "priority with quantized gradients",
              nncomm.DistributedSolver, S.Sgd(0.1), comm,
              compression=nncomm.Compression.quantized(8),
              priority="forward")
    for groups, match in (([[x]], "not a parameter"),
                          ([list(params.values())[:2]] * 2, "two groups")):
        grouped = nncomm.DistributedSolver(S.Sgd(0.1), comm, groups=groups)
        ck.raises(ValueError, match, f"groups: {match}",
                  grouped.set_parameters, params)
    solver = nncomm.DistributedSolver(S.Sgd(0.1), comm,
                                      backward_passes_per_step=2)
    loss.forward()
    ck.raises(RuntimeError, "set_parameters", "backward first",
              solver.backward, loss)
    solver.set_parameters(params)
    ck.raises(RuntimeError, "not all-reduced", "update first", solver.update)
    solver.backward(loss)
    ck.raises(RuntimeError, "1 of 2", "update after one pass of two",
              solver.update)
    solver.backward(loss)
    ck.raises(RuntimeError, "call update()", "a third pass",
              solver.backward, loss)
    solver.update()
    solver.set_learning_rate(0.5)
    ck.equal(solver.learning_rate(), 0.5, "methods pass through")


def turning(variable, after, value):
    """The user's hook: sets `variable.need_grad` to `value` once backward
    has called the function `after` (after the graph analysis, which the
    callback makes at backward's first function)."""
    def hook(f):
        if f == after:
            variable.need_grad = value
    return hook


def mispredicted_step(ck, comm, what, solver, x, t, loss, params, hook,
                      flag, op):
    """One step on rank-dependent data with `flag()` set before each
    backward: a plain backward, then the solver's; its gradients must be
    comm.all_reduce of the plain one's, bit for bit (that all_reduce is
    also an nncomm call between the solver's backward and its update).
    Returns the warnings of the solver's backward, or None if it raised."""
    x.d = contribution(what + "/x", comm.rank, x.shape, np.float32, "rand")
    t.d = contribution(what + "/t", comm.rank, t.shape, np.float32, "rand")
    loss.forward()
    flag()
    solver.zero_grad()
    loss.backward(function_post_hook=hook)
    reference = [nd(v.g) for v in params.values()]
    flag()
    solver.zero_grad()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            solver.backward(loss, function_post_hook=hook)
        except Exception as e:
            ck.fail(what, f"backward raised {exception_chain(e)}")
            return None
    comm.all_reduce(reference, division=op == "average")
    for (name, v), ref in zip(params.items(), reference):
        ck.array(v.grad, ref.data, f"{what}: {name}", np.float32)
    solver.update()
    return [str(w.message) for w in caught]


def backward_raises(ck, what, solver, loss, expected, hook=None):
    """The solver's backward raises with `expected` in its exception chain
    (nnabla wraps what a hook or function raised); then update refuses."""
    ck.count += 1
    try:
        solver.backward(loss, function_post_hook=hook)
        ck.fail(what, "backward did not raise")
    except Exception as e:
        if expected not in exception_chain(e):
            ck.fail(what, f"raised {exception_chain(e)}, not {expected}")
    ck.raises(RuntimeError, "not all-reduced", what + ": no update",
              solver.update)


def mispredicted(ck, comm):
    """need_grad of the last hidden layer's output turned on during
    backward (the analysis expects the output layer's Affine last; four
    functions run after it, writing gradients it did not reach) or off (the
    analysis expects four functions that never run); with op average, in
    two groups (two callbacks)."""
    for op, groups in (("sum", None), ("average", 2)):
        for on in (True, False):
            nn.clear_parameters()
            x, t, loss, params = mlp("mispredicted", 4, comm.rank,
                                     op == "sum")
            err = loss.parent.inputs[0]
            hidden = err.parent.inputs[0].parent.inputs[0]
            hook = turning(hidden, err.parent, on)
            solver = nncomm.DistributedSolver(S.Sgd(0.1), comm, op=op,
                                              groups=groups)
            solver.set_parameters(params)
            for step in range(3):
                what = (f"need_grad turned {'on' if on else 'off'} during "
                        f"backward, op {op}, step {step}")

                def flag():
                    hidden.need_grad = not on
                caught = mispredicted_step(ck, comm, what, solver, x, t,
                                           loss, params, hook, flag, op)
                if caught is None:
                    continue
                # As nnabla's own end of backward tells it: expected
                # functions that never ran are said, with their gradients
                # reduced when backward returned.
                warned = any("backward returned before" in w and
                             "when backward returned" in w for w in caught)
                ck.true(warned != on, f"{what}: "
                        f"{'no warning' if on else 'a warning'}", str(caught))
    # Tied weights: with the hidden layer's need_grad off, the analysis
    # counts one writer of the shared W and b, which go out after it; the
    # first layer, run after once need_grad is turned on, writes them too.
    nn.clear_parameters()
    with nn.parameter_scope("tied"):
        x, t = nn.Variable((4, 3)), nn.Variable((4, 3))
        hidden = F.tanh(PF.affine(x, 3, name="s"))
        err = F.squared_error(PF.affine(hidden, 3, name="s"), t)
        loss = F.mean(err)
        params = nn.get_parameters()
    solver = nncomm.DistributedSolver(S.Sgd(0.1), comm, op="sum")
    solver.set_parameters(params)
    x.d, t.d = np.ones(x.shape), np.zeros(t.shape)
    loss.forward()
    hidden.need_grad = False
    what = "a function the analysis did not expect writes a reduced gradient"
    backward_raises(ck, what, solver, loss, "did not expect",
                    turning(hidden, err.parent, True))
    mispredicted_step(ck, comm, what + ": the next step", solver, x, t, loss,
                      params, None, lambda: setattr(hidden, "need_grad",
                                                    True), "sum")


class Stop(Exception):
    pass


def raising(ck, comm):
    """A function whose backward raises on rank 0 only, where no hook sees
    it: the solver closes that backward at once, so every rank raises
    instead of waiting."""
    stop = [False]

    def write(i, grad):
        if stop[0] and comm.rank == 0:
            raise Stop("a function's backward raised")
        grad.data[...] = comm.rank + i + 1

    nn.clear_parameters()
    with nn.parameter_scope("raising"):
        x, t = nn.Variable((4, 3)), nn.Variable((4, 2))
        h = PF.affine(x, 2, name="a")
        extra = nn.parameter.get_parameter_or_create(
            "extra", (4, 2), np.zeros((4, 2), np.float32))
        y = GradientWriter(get_extension_context("cpu"), write)(h, extra)
        loss = F.mean(F.squared_error(y, t))
        params = nn.get_parameters()
    solver = nncomm.DistributedSolver(S.Sgd(0.1), comm, op="sum")
    solver.set_parameters(params)
    what = "a function raising in backward on rank 0"
    x.d, t.d = np.ones(x.shape), np.zeros(t.shape)
    loss.forward()
    solver.zero_grad()
    stop[0] = True
    backward_raises(ck, what, solver, loss,
                    "Stop" if comm.rank == 0 else "another rank")
    stop[0] = False
    mispredicted_step(ck, comm, what + ": the next step", solver, x, t, loss,
                      params, None, lambda: None, "sum")


def main():
    ck = Checker("distributed_solver")
    comm, _ = make_comm()
    run(ck, comm, "average Momentum", lambda: S.Momentum(0.1, 0.9))
    run(ck, comm, "sum Momentum", lambda: S.Momentum(0.01, 0.9), op="sum")
    run(ck, comm, "average Adam, 2 passes", lambda: S.Adam(0.01), passes=2)
    # Gradients rounded to 16 bits on the wire: within their precision
    # (bf16 keeps 8 bits) of the reference after 5 steps.
    run(ck, comm, "average Momentum, fp16", lambda: S.Momentum(0.1, 0.9),
        compression=nncomm.Compression.fp16, tol=5e-3)
    run(ck, comm, "average Momentum, bf16", lambda: S.Momentum(0.1, 0.9),
        compression=nncomm.Compression.bf16, tol=3e-2)
    run(ck, comm, "average Momentum, predivide 4",
        lambda: S.Momentum(0.1, 0.9), gradient_predivide_factor=4.0)
    run(ck, comm, "average Adam, 2 groups", lambda: S.Adam(0.01), groups=2)
    run(ck, comm, "average Momentum, groups by hand",
        lambda: S.Momentum(0.1, 0.9),
        groups=lambda p: [[p["a/affine/W"], p["c/affine/b"]],
                          [p["b/affine/W"]]])
    run(ck, comm, "average Momentum, priority forward",
        lambda: S.Momentum(0.1, 0.9), priority="forward", pack_size=16)
    run(ck, comm, "average Momentum, 2 steps alone",
        lambda: S.Momentum(0.1, 0.9), warm_steps=2)
    run(ck, comm, "average Adam, 2 passes, 1 step alone",
        lambda: S.Adam(0.01), passes=2, warm_steps=1)
    if comm.size >= 2:
        pair = [comm.size - 1, 0]
        comm.new_group(("pair", pair))
        run(ck, comm, "average Sgd on a pair", lambda: S.Sgd(0.1),
            group="pair")
    misuse(ck, comm)
    mispredicted(ck, comm)
    raising(ck, comm)
    ck.finish()


main()
