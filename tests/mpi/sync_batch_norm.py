"""nnabla's own sync batch normalization with nncomm's communicator,
called as nnabla's scripts call it (F.sync_batch_normalization and
PF.sync_batch_normalization, unchanged), equals batch normalization over
the global batch: nnabla's F.batch_normalization run on every rank's
samples at once, in one process.

Each case, on the world and on a named group: every member normalizes its
share of a global batch; the output, the gradient of x and the batch
statistics (output_stat) must equal the reference's share; the running
mean and variance the reference's; the gradients of beta and gamma, summed
over the members as data-parallel training sums them, the reference's.
For axes [1] and [3], batch_stat True and False, output_stat (which
nnabla allows with batch_stat only), and beta,
gamma, mean and variance each given or None (mean and variance only with
batch_stat). Inside comm.join(), over the ranks still training. An
unknown group raises, on every member.
"""
import itertools

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF

from _harness import Checker, contribution, make_comm

SHAPE = (2, 3, 4, 5)    # per rank
TOL = 2e-5


def close(ck, got, want, what):
    """float32 rounding apart: the sums run in another order."""
    want = np.asarray(want)
    ck.array(np.asarray(got), want, what, np.float32,
             TOL * (1 + np.abs(want)))


def stat_shape(axes):
    return tuple(s if i in axes else 1 for i, s in enumerate(SHAPE))


def global_batch(key, members):
    """Every member's share, concatenated: (x, dy)."""
    xs = [contribution(f"{key}/x", r, SHAPE, np.float32, "rand")
          for r in members]
    dys = [contribution(f"{key}/dy", r, SHAPE, np.float32, "rand")
           for r in members]
    return np.concatenate(xs), np.concatenate(dys)


def variables(key, axes, given):
    """beta, gamma, mean, variance (None where not `given`), the same
    values on every rank."""
    out = []
    for name in ("beta", "gamma", "mean", "variance"):
        if name not in given:
            out.append(None)
            continue
        noise = 0.1 * contribution(f"{key}/{name}", 0, stat_shape(axes),
                                   np.float32, "rand")
        value = {"beta": noise, "gamma": 1 + noise, "mean": noise,
                 "variance": 1 + np.abs(noise)}[name]
        v = nn.Variable.from_numpy_array(
            value.astype(np.float32), need_grad=name in ("beta", "gamma"))
        v.g = 0
        out.append(v)
    return out


def run(bn, x_value, dy_value, params, **kwargs):
    """forward and backward of `bn` on x; (outputs' data, x's gradient,
    the parameters' gradients and data after)."""
    x = nn.Variable.from_numpy_array(x_value, need_grad=True)
    x.g = 0
    outs = bn(x, *params, **kwargs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    y = outs[0]
    y.forward()
    y.backward(dy_value)
    return ([o.d.copy() for o in outs], x.g.copy(),
            [None if p is None else (p.d.copy(), p.g.copy())
             for p in params])


def case(ck, comm, members, group, axes, batch_stat, output_stat, given):
    key = f"{group}/{axes}/{batch_stat}/{output_stat}/{''.join(given)}"
    what = (f"group {group}, axes {axes}, batch_stat {batch_stat}, "
            f"output_stat {output_stat}, given {given}")
    x_all, dy_all = global_batch(key, members)
    me = members.index(comm.rank)
    share = slice(me * SHAPE[0], (me + 1) * SHAPE[0])
    kwargs = dict(axes=axes, batch_stat=batch_stat, output_stat=output_stat)
    ref = run(F.batch_normalization, x_all, dy_all,
              variables(key, axes, given), **kwargs)
    got = run(lambda x, *p, **k: F.sync_batch_normalization(
        x, *p, comm, group=group, **k), x_all[share], dy_all[share],
        variables(key, axes, given), **kwargs)
    close(ck, got[0][0], ref[0][0][share], f"{what}: output")
    for i, name in enumerate(("batch mean", "batch variance"), 1):
        if output_stat:
            close(ck, got[0][i], ref[0][i], f"{what}: {name}")
    close(ck, got[1], ref[1][share], f"{what}: gradient of x")
    for name, mine, want in zip(("beta", "gamma", "mean", "variance"),
                                got[2], ref[2]):
        if mine is None:
            continue
        data, grad = mine
        if name in ("beta", "gamma"):
            # The member's share of the gradient: data-parallel training
            # sums them.
            total = nn.NdArray.from_numpy_array(grad)
            comm.all_reduce(total, group=group)
            close(ck, total.data, want[1], f"{what}: gradient of {name}")
        else:
            close(ck, data, want[0], f"{what}: running {name}")


def parametric(ck, comm):
    """PF.sync_batch_normalization, its parameters in a scope."""
    world = list(range(comm.size))
    x_all, dy_all = global_batch("pf", world)
    share = slice(comm.rank * SHAPE[0], (comm.rank + 1) * SHAPE[0])
    outputs = []
    for name, x_value, dy_value in (("sync", x_all[share], dy_all[share]),
                                    ("plain", x_all, dy_all)):
        with nn.parameter_scope(f"pf_{name}"):
            x = nn.Variable.from_numpy_array(x_value)
            y = (PF.sync_batch_normalization(x, comm) if name == "sync"
                 else PF.batch_normalization(x))
            y.forward()
            y.backward(dy_value)
            outputs.append((y.d.copy(), {k: (p.d.copy(), p.g.copy())
                                         for k, p in nn.get_parameters(
                                             grad_only=False).items()}))
    (y, params), (ref, ref_params) = outputs
    close(ck, y, ref[share], "PF.sync_batch_normalization: output")
    for k in ("bn/mean", "bn/var"):
        close(ck, params[k][0], ref_params[k][0],
              f"PF.sync_batch_normalization: running {k}")
    for k in ("bn/beta", "bn/gamma"):
        total = nn.NdArray.from_numpy_array(params[k][1])
        comm.all_reduce(total)
        close(ck, total.data, ref_params[k][1],
              f"PF.sync_batch_normalization: gradient of {k}")


def joined(ck, comm):
    """Inside comm.join(), rank r trains r + 1 steps: at step s, ranks s
    and above train, and sync batch normalization over the world must equal
    batch normalization over their samples alone (the ranks that left add
    zeros to the sums, which nnabla divides by the world's size). Running
    statistics are left out: nnabla's unbiased running variance counts the
    world's samples (N / (N - 1))."""
    with comm.join([{}]):
        for step in range(comm.rank + 1):
            case(ck, comm, list(range(step, comm.size)), "world", [1], True,
                 True, ("beta", "gamma"))
    # On a group, beside a world all_reduce per step: counting the ranks
    # still training must not end a leaver's part in the scope, even with
    # throw_on_early_termination (which only a callback's count triggers).
    evens = list(range(0, comm.size, 2))
    with comm.join([{}], throw_on_early_termination=True):
        for step in range(comm.rank + 1):
            if comm.rank in evens:
                case(ck, comm, [r for r in evens if r >= step], "evens",
                     [1], True, True, ("beta", "gamma"))
            ones = nn.NdArray.from_numpy_array(np.ones(1, np.float32))
            comm.all_reduce(ones)
            ck.equal(float(ones.data[0]), float(comm.size - step),
                     f"join: the world all_reduce of step {step}")


def unknown_group(ck, comm):
    x = nn.Variable.from_numpy_array(np.ones(SHAPE, np.float32))
    ck.raises(ValueError, "unknown group 'nowhere'",
              "sync_batch_normalization on an unknown group",
              lambda: F.sync_batch_normalization(
                  x, None, None, None, None, comm, group="nowhere").forward())


def main():
    ck = Checker("sync_batch_norm")
    comm, _ = make_comm()
    n = comm.size
    evens = list(range(0, n, 2))
    comm.new_group(("evens", evens))
    groups = [("world", list(range(n))), ("evens", evens)]
    for (group, members), axes, batch_stat, output_stat in itertools.product(
            groups, ([1], [3]), (True, False), (False, True)):
        if comm.rank not in members or (output_stat and not batch_stat):
            continue
        for given in (("beta", "gamma", "mean", "variance"),
                      ("mean", "variance"), ("beta", "gamma"), ()):
            if not batch_stat and "mean" not in given:
                continue
            case(ck, comm, members, group, axes, batch_stat, output_stat,
                 given)
    parametric(ck, comm)
    if n > 1:
        joined(ck, comm)
    unknown_group(ck, comm)
    ck.finish()


main()
