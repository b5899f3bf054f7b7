"""DistributedSolver(shard="state"), ZeRO stage 1, and shard="gradients",
ZeRO stage 2 (with ``--shard=gradients``): steps as the unsharded
DistributedSolver does.

`steps` (the default): on every rank, two copies of the 6-9-8-2 tanh MLP
(161 elements: at 3 ranks the ranges are 53, 54, 54 elements and parameters
straddle them) from the same start, one under the unsharded
DistributedSolver, one sharded, trained on the same batches. Elementwise
solvers (SGD, Momentum, Adam, with weight_decay and scale_grad) must give
bit-identical parameters after every step; clip_grad_by_norm sums a
straddling parameter's norm over ranks, so it is checked against a numpy
reference of nnabla's per-parameter clipping, within float32 rounding, as
are the parameters. Then: fp16 compression, backward_passes_per_step,
groups, check_finite and a predivide factor with sharding; a sub-group; the
solver-state bytes per rank (1/N); the check_*_grad methods finding a NaN
on one rank on every rank; the digits MLP for 50 Adam steps; and bad input
raising ValueError or NotImplementedError on every rank, before any
communication or on every rank at once. Stage 2 reduces each element onto
its owner alone, in another order than the all-reduce's: its parameters are
compared within float32 rounding where more than 2 ranks sum; after
backward, each rank's gradients equal the unsharded all-reduce's where it
owns them and are NaN elsewhere.

`save DIR`: 3 sharded Adam steps, then save_states(DIR) and the
parameters. `load DIR`: loads them at another rank count, checks the state
against an unsharded run's, trains 2 steps more and compares with an
unsharded run of 5 steps; consolidate_states makes an ordinary Adam's state
of the checkpoint, equal to the unsharded run's.
"""
import os
import sys

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S

import nncomm
from nncomm.sharded_state import element_ranges

from _harness import Checker, make_comm, mlp, placed

BATCH = 24
STEPS = 5
TOL = 2e-6  # float32 rounding of a few steps, relative to 1
KIND = "gradients" if "--shard=gradients" in sys.argv else "state"


def batch(step):
    rng = np.random.default_rng(200 + step)
    return (rng.standard_normal((BATCH, 6)).astype(np.float32),
            rng.standard_normal((BATCH, 2)).astype(np.float32))


def twins(comm, scope, size, make, options):
    """The MLP under the unsharded and the sharded solver, from one start:
    [(x, t, loss, params, solver)] * 2."""
    shard = BATCH // size // options.get("backward_passes_per_step", 1)
    models = []
    for kind in (None, KIND):
        nn.clear_parameters()
        x, t, loss, params = mlp(f"{scope}_{kind}", shard, 7)
        start_as(params, models)
        solver = nncomm.DistributedSolver(make(), comm, shard=kind,
                                          **options)
        solver.set_parameters(params)
        models.append((x, t, loss, params, solver))
    return models


def start_as(params, models):
    """`params` take the first model's values (nnabla draws initial
    weights from its own generator, not numpy's seeded one)."""
    if models:
        for v, first in zip(params.values(), models[0][3].values()):
            v.d = first.d


def step(model, step_no, size, me, passes=1, prepare=None):
    x, t, loss, params, solver = model
    xs, ts = batch(step_no)
    rows = BATCH // size
    mine = slice(me * rows, (me + 1) * rows)
    xs, ts = xs[mine], ts[mine]
    solver.zero_grad()
    per = rows // passes
    for p in range(passes):
        x.d, t.d = xs[p * per:(p + 1) * per], ts[p * per:(p + 1) * per]
        loss.forward()
        solver.backward(loss)
    if prepare is not None:
        prepare(solver)
    solver.update()


def same_steps(ck, comm, what, make, group="world", prepare=None,
               exact=True, reference=None, **options):
    """The sharded and unsharded solvers' parameters after each of STEPS
    steps: identical (`exact`), or each within float32 rounding of
    `reference(plain_params_before, grads)`'s."""
    if placed(comm, group) is None:
        return
    size, me = placed(comm, group)
    plain, sharded = twins(comm, what.replace(" ", "_"), size, make,
                           dict(options, group=group))
    # Stage 2's reduce sums in another order than the all-reduce once more
    # than two ranks add: in float16, rounded after each addition.
    exact = exact and (KIND == "state" or size <= 2)
    tol = TOL if "compression" not in options else 1e-4
    passes = options.get("backward_passes_per_step", 1)
    for s in range(STEPS):
        step(plain, s, size, me, passes, prepare)
        step(sharded, s, size, me, passes, prepare)
        for name, v in sharded[3].items():
            expected = plain[3][name].d
            if exact:
                ck.array(v.data, expected, f"{what}: {name} after step {s}")
            else:
                ck.array(v.data, expected, f"{what}: {name} after step {s}",
                         tol=tol * (1 + np.abs(expected)))


def clipped_reference(ck, comm, clip):
    """clip_grad_by_norm on shards against numpy's per-parameter clipping
    of the full reduced gradients, and the update after it."""
    size, me = placed(comm, "world")
    _, sharded = twins(comm, "clip", size, lambda: S.Sgd(0.5), {})
    x, t, loss, params, solver = sharded
    clipped = 0
    for s in range(3):
        xs, ts = batch(s)
        rows = BATCH // size
        x.d, t.d = xs[me * rows:(me + 1) * rows], ts[me * rows:(me + 1) * rows]
        loss.forward()
        solver.zero_grad()
        solver.backward(loss)
        before = {n: (v.d.copy(), v.g.copy()) for n, v in params.items()}
        solver.clip_grad_by_norm(clip)
        solver.update()
        for name, v in params.items():
            data, grad = before[name]
            norm = np.sqrt(np.sum(grad.astype(np.float64) ** 2))
            if norm > clip:
                grad = clip * grad / norm
                clipped += 1
            expected = data - 0.5 * grad
            ck.array(v.data, expected, f"clip {clip}: {name} step {s}",
                     tol=TOL * (1 + np.abs(expected)))
    ck.true(0 < clipped < 3 * len(params),
            f"premise: clip {clip} clips some gradients of 3 steps, not all "
            f"({clipped})")


def state_bytes(ck, comm):
    size, me = placed(comm, "world")
    plain, sharded = twins(comm, "bytes", size, lambda: S.Adam(1e-3), {})
    step(plain, 0, size, me)
    step(sharded, 0, size, me)

    def count(solver):
        return sum(v.size for st in solver.get_states().values()
                   for v in st.pstate.values())
    total = sum(v.size for v in plain[3].values())
    start, stop = element_ranges(total, size)[me]
    ck.equal(count(plain[4]), 2 * total, "unsharded Adam: 2 T state elements")
    ck.equal(count(sharded[4]), 2 * (stop - start),
             "sharded Adam: 2 elements of state per owned element")
    ck.equal(sum(v.size for v in sharded[4].solver.shards.values()),
             stop - start, "the shard Variables hold this rank's range")
    everyone = comm_sum(comm, count(sharded[4]))
    ck.equal(everyone, 2 * total, "the shards' states cover T once")
    ck.true(abs(count(sharded[4]) - 2 * total / size) <= 2,
            "sharded state is 1/N of the unsharded within an element")


def comm_sum(comm, value):
    a = nn.NdArray.from_numpy_array(np.array([value], np.int64))
    comm.all_reduce(a)
    return int(a.data[0])


def checks_combined(ck, comm):
    """A NaN in the one rank's shard is seen by every rank."""
    size, me = placed(comm, "world")
    _, sharded = twins(comm, "nan", size, lambda: S.Adam(1e-3), {})
    x, t, loss, params, solver = sharded
    xs, ts = batch(0)
    x.d, t.d = xs[:x.shape[0]], ts[:t.shape[0]]
    loss.forward()
    solver.zero_grad()
    solver.backward(loss)
    ck.equal(solver.check_inf_or_nan_grad(), False, "finite: no finding")
    total = sum(v.size for v in params.values())
    last = element_ranges(total, size)[-1][1] - 1  # the last rank's
    v = list(params.values())[-1]
    g = v.g
    g.reshape(-1)[last - (total - v.size)] = np.nan
    v.g = g
    ck.equal(solver.check_nan_grad(), True,
             f"a NaN in group rank {size - 1}'s shard, seen on every rank")
    ck.equal(solver.check_inf_or_nan_grad(), True, "check_inf_or_nan_grad")
    ck.equal(solver.check_inf_grad(), False, "no infinity")


def digits(ck, comm):
    """The 64-64-10 digits MLP: 50 Adam steps sharded and unsharded."""
    from sklearn.datasets import load_digits
    d = load_digits()
    X = (d.data / 16.0).astype(np.float32)
    T = d.target.astype(np.int32).reshape(-1, 1)
    size, me = placed(comm, "world")
    rows = 64 // size
    models = []
    for kind in (None, KIND):
        np.random.seed(0)
        x, t = nn.Variable((rows, 64)), nn.Variable((rows, 1))
        with nn.parameter_scope(f"digits_{kind}"):
            h = F.relu(PF.affine(x, 64, name="fc1"))
            loss = F.mean(F.softmax_cross_entropy(PF.affine(h, 10,
                                                            name="fc2"), t))
            params = nn.get_parameters()
        start_as(params, models)
        solver = nncomm.DistributedSolver(S.Adam(1e-3), comm, shard=kind)
        solver.set_parameters(params)
        models.append((x, t, loss, params, solver))
    rng = np.random.RandomState(1)
    for _ in range(50):
        picked = rng.randint(0, len(X), 64)[me * rows:(me + 1) * rows]
        for x, t, loss, _, solver in models:
            x.d, t.d = X[picked], T[picked]
            loss.forward()
            solver.zero_grad()
            solver.backward(loss, clear_buffer=True)
            solver.update()
    for name, v in models[1][3].items():
        expected = models[0][3][name].d
        ck.array(v.data, expected, f"digits: {name} after 50 Adam steps",
                 tol=0 if KIND == "state" or size <= 2 else
                 1e-5 * (1 + np.abs(expected)))


def owned_gradients(ck, comm):
    """Stage 2: after backward, the gradients of this rank's range equal
    the unsharded solver's all-reduced ones; every other element is NaN,
    released parameters' too."""
    size, me = placed(comm, "world")
    plain, sharded = twins(comm, "owned", size, lambda: S.Adam(1e-3), {})
    for x, t, loss, _, solver in (plain, sharded):
        xs, ts = batch(0)
        rows = BATCH // size
        x.d, t.d = xs[me * rows:(me + 1) * rows], ts[me * rows:(me + 1) * rows]
        loss.forward()
        solver.zero_grad()
        solver.backward(loss)
    total = sum(v.size for v in plain[3].values())
    start, stop = element_ranges(total, size)[me]
    at, released = 0, 0
    for name, v in sharded[3].items():
        got, want = v.g.reshape(-1), plain[3][name].g.reshape(-1)
        lo, hi = min(max(start - at, 0), v.size), min(max(stop - at, 0),
                                                      v.size)
        ck.array(got[lo:hi], want[lo:hi], f"owned gradient of {name}",
                 tol=1e-6 * (1 + np.abs(want[lo:hi])))
        rest = np.concatenate([got[:lo], got[hi:]])
        ck.true(np.isnan(rest).all(),
                f"{name}: the {rest.size} elements of other ranks are NaN")
        released += lo == hi
        at += v.size
    ck.true(size == 1 or released > 0,
            f"premise: some parameter lies wholly on other ranks "
            f"({released})")


def bad_input(ck, comm):
    size, me = placed(comm, "world")
    for shard in ("bogus", True):
        ck.raises(ValueError, "shard must be", f"shard={shard!r}",
                  nncomm.DistributedSolver, S.Adam(), comm, shard=shard)
    ck.raises(ValueError, "quantized", "shard with quantized compression",
              nncomm.DistributedSolver, S.Adam(), comm, shard=KIND,
              compression=nncomm.Compression.quantized(1))
    ck.raises(ValueError, "distributed_after", "shard with a warm start",
              nncomm.DistributedSolver, S.Adam(), comm, shard=KIND,
              distributed_after=10)
    ck.raises(ValueError, "Lamb", "shard a LAMB",
              nncomm.DistributedSolver, S.Lamb(), comm, shard=KIND)
    ck.raises(ValueError, "takes no hook", "shard='gradients' with a hook",
              nncomm.DistributedSolver, S.Adam(), comm, shard="gradients",
              hook=nncomm.hooks.fp16_compress)
    nn.clear_parameters()
    x, t, loss, params = mlp("bad", 2, 3)
    solver = nncomm.DistributedSolver(S.Adam(), comm, shard=KIND)
    ck.raises(NotImplementedError, "one set_parameters", "reset=False",
              solver.set_parameters, params, reset=False)
    ck.raises(ValueError, "join", "comm.join beside a sharded solver",
              comm.join, [solver])
    solver.set_parameters(params)
    for what, call in (("remove_parameters", lambda: solver.remove_parameters(
            ["bad/a/affine/W"])), ("setup", lambda: solver.setup(params)),
            ("set_states_to_protobuf",
             lambda: solver.set_states_to_protobuf(None))):
        ck.raises(NotImplementedError, f"shard={KIND!r}", what, call)
    ck.raises(RuntimeError, "not all-reduced", "update before backward",
              solver.update)
    ck.raises(ValueError, "no sharded_states.json", "load a missing "
              "checkpoint", solver.load_states, "/nonexistent/nncomm/ckpt")
    # Parameters registered in another order on the last rank: the
    # element space would differ, so every rank refuses.
    nn.clear_parameters()
    _, _, _, params = mlp("order", 2, 3)
    if me == size - 1 and size > 1:
        params = dict(reversed(list(params.items())))
    other = nncomm.DistributedSolver(S.Adam(), comm, shard=KIND)
    if size > 1:
        ck.raises(ValueError, "registration order", "parameters in another "
                  "order on one rank", other.set_parameters, params)


def save(ck, comm, directory):
    size, me = placed(comm, "world")
    nn.clear_parameters()
    x, t, loss, params = mlp("ckpt", BATCH // size, 7)
    solver = nncomm.DistributedSolver(S.Adam(1e-2), comm, shard=KIND)
    solver.set_parameters(params)
    os.makedirs(directory, exist_ok=True)
    if me == 0:
        np.savez(os.path.join(directory, "start.npz"),
                 **{n: v.d for n, v in params.items()})
    model = (x, t, loss, params, solver)
    for s in range(3):
        step(model, s, size, me)
    solver.save_states(directory)
    if me == 0:
        np.savez(os.path.join(directory, "params.npz"),
                 **{n: v.d for n, v in params.items()})
    ck.true(os.path.exists(os.path.join(directory, f"states.{me}.npz")),
            "this rank's state file written")


def load(ck, comm, directory):
    """Resumes the 2-rank checkpoint at this rank count, beside an
    unsharded run of the same 5 steps from the same start."""
    size, me = placed(comm, "world")
    rows = BATCH // size
    begin = np.load(os.path.join(directory, "start.npz"))
    models = []
    for scope, kind in (("plain", None), ("ckpt", KIND)):
        nn.clear_parameters()
        x, t, loss, params = mlp(scope, rows, 7)
        for name, v in params.items():
            v.d = begin[name]
        solver = nncomm.DistributedSolver(S.Adam(1e-2), comm, shard=kind)
        solver.set_parameters(params)
        models.append((x, t, loss, params, solver))
    plain, sharded = models
    saved = np.load(os.path.join(directory, "params.npz"))
    for name, v in sharded[3].items():
        v.d = saved[name]
    sharded[4].load_states(directory)
    for s in range(3):
        step(plain, s, size, me)
    flat = {key: np.concatenate([plain[4].get_states()[n].pstate[key].d
                                 .reshape(-1) for n in plain[3]])
            for key in ("mean", "var")}
    sizes = [v.size for v in plain[3].values()]
    offsets = dict(zip(sharded[3], np.cumsum([0] + sizes[:-1]).tolist()))
    start, stop = element_ranges(sum(sizes), size)[me]
    covered = 0
    for shard, state in sharded[4].get_states().items():
        name, span = shard.rsplit("[", 1)
        a, b = map(int, span.rstrip("]").split(":"))
        covered += b - a
        for key in ("mean", "var"):
            expected = flat[key][offsets[name] + a:offsets[name] + b]
            ck.array(state.pstate[key].data, expected,
                     f"loaded {key} of {shard}",
                     tol=1e-5 * (1e-3 + np.abs(expected)))
        ck.equal(state.t, 3, f"loaded t of {shard}")
    ck.equal(covered, stop - start, "the loaded shards cover this range")
    for s in range(3, 5):
        step(plain, s, size, me)
        step(sharded, s, size, me)
    for name, v in sharded[3].items():
        expected = plain[3][name].d
        ck.array(v.data, expected, f"resumed at {size} ranks: {name}",
                 tol=1e-5 * (1 + np.abs(expected)))
    consolidated(ck, directory)


def consolidated(ck, directory):
    """consolidate_states into an ordinary Adam: the rank files' slices
    end to end, in the parameters' shapes; refused for other parameters
    or another solver."""
    nn.clear_parameters()
    _, _, _, params = mlp("ckpt", 2, 7)
    ordinary = S.Adam(1e-2)
    ordinary.set_parameters(params)
    nncomm.consolidate_states(directory, ordinary)
    files = [np.load(os.path.join(directory, f"states.{r}.npz"))
             for r in range(2)]
    states = ordinary.get_states()
    ck.equal(sorted(states), sorted(params), "consolidated: every parameter")
    for i, name in enumerate(params):  # the index the files key by
        state = states[name]
        ck.equal(state.t, 3, f"consolidated t of {name}")
        for key in ("mean", "var"):
            pieces = [f[f"{i}/{key}"] for f in files
                      if f"{i}/{key}" in f.files]
            ck.array(state.pstate[key].data,
                     np.concatenate(pieces).reshape(params[name].shape),
                     f"consolidated {key} of {name}")
    nn.clear_parameters()
    _, _, _, others = mlp("other", 2, 7)
    others = {f"x{name}": v for name, v in others.items()}
    wrong = S.Adam(1e-2)
    wrong.set_parameters(others)
    ck.raises(ValueError, "(name, shape)", "consolidating into other "
              "parameters", nncomm.consolidate_states, directory, wrong)
    momentum = S.Momentum(0.1, 0.9)
    momentum.set_parameters(params)
    ck.raises(ValueError, "Adam's state", "consolidating into another "
              "solver", nncomm.consolidate_states, directory, momentum)


def main():
    ck = Checker("sharded_state")
    comm, _ = make_comm()
    mode = sys.argv[1] if len(sys.argv) > 1 else "steps"
    if mode == "save":
        save(ck, comm, sys.argv[2])
    elif mode == "load":
        load(ck, comm, sys.argv[2])
    else:
        ranks = list(range(comm.size))[::-1]
        comm.new_group(("reversed", ranks))

        def decayed(solver):
            solver.weight_decay(1e-2)
            solver.scale_grad(0.5)
        same_steps(ck, comm, "sgd", lambda: S.Sgd(0.1))
        same_steps(ck, comm, "momentum decayed", lambda: S.Momentum(0.1, 0.9),
                   prepare=decayed)
        same_steps(ck, comm, "adam decayed", lambda: S.Adam(1e-2),
                   prepare=decayed)
        same_steps(ck, comm, "adamw", lambda: S.AdamW(1e-2, wd=1e-2))
        same_steps(ck, comm, "adam clipped", lambda: S.Adam(1e-2),
                   prepare=lambda s: s.clip_grad_by_norm(0.5), exact=False)
        same_steps(ck, comm, "adam fp16", lambda: S.Adam(1e-2),
                   compression=nncomm.Compression.fp16)
        same_steps(ck, comm, "adam two passes", lambda: S.Adam(1e-2),
                   backward_passes_per_step=2)
        same_steps(ck, comm, "adam predivided", lambda: S.Adam(1e-2),
                   gradient_predivide_factor=4)
        same_steps(ck, comm, "adam groups checked", lambda: S.Adam(1e-2),
                   groups=2, check_finite=True)
        same_steps(ck, comm, "adam reversed group", lambda: S.Adam(1e-2),
                   group="reversed")
        if KIND == "state":  # its reference reads every full gradient
            clipped_reference(ck, comm, 0.5)
        else:
            owned_gradients(ck, comm)
        state_bytes(ck, comm)
        checks_combined(ck, comm)
        digits(ck, comm)
        bad_input(ck, comm)
    ck.finish()


if __name__ == "__main__":
    main()
