"""all_reduce_callback follows the gradients' runtime dtypes and sizes: a
bucket plan made for other dtypes or sizes is never used to read or write
out of bounds, and the results stay those of all_reduce.

- A fresh float16 model (gradients not allocated yet, so reporting
  float32 when backward starts), keep_dtype True and False, with a
  gradient large enough to be reduced in place (a direct bucket).
- A float16 model whose ranks' backwards reach different heads, which
  change from step to step, never allocated at first.
- A Python function that writes its inputs' gradients cast to float16 or
  float32 during backward (nnabla's own callback test), also on gradients
  that are narrowed views of two shared arrays.
- A parameter reshaped with reset_shape(..., force=True) between steps,
  with the graph rebuilt over it.

The reference is a plain backward, gathered from every rank through mpi4py
and reduced in float64; float16 results are held to float16 rounding.
"""
import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
from nnabla.ext_utils import get_extension_context

from _harness import (Checker, GradientWriter, contribution,
                      exception_chain, make_comm, scaled_reference,
                      share_gradients, world_gather)

F16, F32 = np.float16, np.float32


def check(ck, what, params, names, gathered, world, scale, division,
          keep_dtype):
    for i, p in enumerate(params):
        dt = gathered[0][i].dtype
        ref, tol = scaled_reference([gathered[r][i] for r in world], scale,
                                    division, dt if keep_dtype else F32, dt)
        ck.array(p.grad, ref, f"{what}: {names[i]}", p.grad.dtype, tol)


def run(ck, comm, what, params, names, step, make_cb, scale=1.0,
        division=True, keep_dtype=False):
    """A plain backward (the reference) and the same with the callback."""
    world = list(range(comm.size))
    step()
    gathered = world_gather([p.grad for p in params])
    try:
        step(make_cb())
    except Exception as e:
        ck.fail(what, f"backward raised {exception_chain(e)}")
        return
    check(ck, what, params, names, gathered, world, scale, division,
          keep_dtype)


def half_model(scope):
    """A float16 model whose first weight (600 x 520, over the 1 MiB
    direct size as float32) is reduced in place."""
    half = get_extension_context("cpu", type_config="half")
    with nn.parameter_scope(scope), nn.context_scope(half):
        x, t = nn.Variable((2, 600)), nn.Variable((2, 4))
        h = F.tanh(PF.affine(x, 520, name="big"))
        loss = F.mean(F.squared_error(PF.affine(h, 4, name="out"), t))
    with nn.parameter_scope(scope):
        params = nn.get_parameters()

    def step(key, rank, hook=None):
        x.d = contribution(key + "/x", rank, x.shape, F32, "rand") / 8
        t.d = contribution(key + "/t", rank, t.shape, F32, "rand")
        loss.forward()
        for p in params.values():
            p.grad.zero()
        loss.backward(function_post_hook=hook)

    return step, list(params), list(params.values())


def fresh_half_model(ck, comm):
    """The callback's first backward meets gradients never allocated (so
    reporting float32 when backward starts); a twin model with the same
    parameters and data gives the reference."""
    world = list(range(comm.size))
    for keep_dtype in (False, True):
        for pack in (7, 2 << 20):
            scope = f"fresh_{keep_dtype}_{pack}"
            step, names, variables = half_model(scope)
            ref_step, _, ref_variables = half_model(scope + "_twin")
            for p, twin in zip(variables, ref_variables):
                twin.d = p.d
            grads = [p.grad for p in variables]
            for it in range(3):
                key = f"{scope}/{it}"
                what = (f"fresh float16 model keep_dtype={keep_dtype} "
                        f"pack_size={pack} step {it}")
                ref_step(key, comm.rank)
                gathered = world_gather([p.grad for p in ref_variables])
                try:
                    step(key, comm.rank, comm.all_reduce_callback(
                        grads, pack, division=True, scale_grad=0.5,
                        keep_dtype=keep_dtype))
                except Exception as e:
                    ck.fail(what, f"backward raised {exception_chain(e)}")
                    continue
                ck.true(all(g.dtype == F16 for g in grads),
                        f"premise: {what}: float16 gradients")
                check(ck, what, variables, names, gathered, world, 0.5, True,
                      keep_dtype)


def half_heads_per_rank(ck, comm):
    """A fresh float16 model of three heads on one trunk, each rank's loss
    at step s through head (rank + s) % 3: ranks reach different heads, a
    head first reached by several ranks at once, one no rank reaches
    (reduced at the end), all never allocated at first (nnabla says
    float32 for them). The result is the twin's plain backward,
    gathered."""
    half = get_extension_context("cpu", type_config="half")
    world = list(range(comm.size))
    for keep_dtype in (False, True):
        models = []
        for twin in ("", "_twin"):
            scope = f"heads_{keep_dtype}{twin}"
            np.random.seed(31)
            with nn.parameter_scope(scope), nn.context_scope(half):
                x, t = nn.Variable((2, 6)), nn.Variable((2, 3))
                h = F.tanh(PF.affine(x, 5, name="trunk"))
                losses = [F.mean(F.squared_error(
                    PF.affine(h, 3, name=f"head{k}"), t)) for k in range(3)]
            with nn.parameter_scope(scope):
                params = nn.get_parameters()
            models.append((x, t, losses, list(params), list(params.values())))
        for p, twin in zip(models[0][4], models[1][4]):
            twin.d = p.d

        def step(model, key, it, hook=None):
            x, t, losses, _, variables = model
            x.d = contribution(key + "/x", comm.rank, x.shape, F32, "rand")
            t.d = contribution(key + "/t", comm.rank, t.shape, F32, "rand")
            loss = losses[(comm.rank + it) % 3]
            loss.forward()
            for p in variables:
                p.grad.zero()
            loss.backward(function_post_hook=hook)

        names, variables = models[0][3], models[0][4]
        grads = [p.grad for p in variables]
        for it in range(4):
            key = f"heads_{keep_dtype}/{it}"
            what = f"float16 heads per rank keep_dtype={keep_dtype} step {it}"
            step(models[1], key, it)
            gathered = world_gather([p.grad for p in models[1][4]])
            try:
                step(models[0], key, it, comm.all_reduce_callback(
                    grads, 7, division=True, keep_dtype=keep_dtype))
            except Exception as e:
                ck.fail(what, f"backward raised {exception_chain(e)}")
                continue
            for i, p in enumerate(variables):
                ref, tol = scaled_reference(
                    [gathered[r][i] for r in world], 1.0, True,
                    F16 if keep_dtype else F32, F16)
                try:
                    dt = p.grad.dtype
                except RuntimeError:  # never written on any rank
                    ck.true(not ref.any(), f"{what}: {names[i]} unwritten",
                            str(ref))
                    continue
                # One this rank's backward never wrote is allocated in the
                # plan's dtype, which nncomm takes from the ranks' arrays
                # (float32 for those never written, as the communicator's
                # context says here), and may stay so.
                ck.array(p.grad, ref, f"{what}: {names[i]}",
                         dt if dt in (F16, F32) else F16, tol)


def constant_grad(ctx, value, dtype):
    """Writes `value` into both inputs' gradients, cast to `dtype`."""
    def write(i, grad):
        grad.fill(value)
        grad.cast(dtype, ctx)
    return GradientWriter(ctx, write)


def cast_during_backward(ck, comm):
    ctx = get_extension_context("cpu")
    x = nn.Variable((4,))
    leaves = {"a": nn.Variable((2, 3, 4), need_grad=True),
              "b": nn.Variable((5, 1), need_grad=True),
              "c": nn.Variable((), need_grad=True),
              "d": nn.Variable((1, 3), need_grad=True)}
    h = x
    for (name, v), dt, value in zip(leaves.items(), (F32, F16, F32, F16),
                                    (0.1, 0.2, 0.3, 0.4)):
        h = constant_grad(ctx, value * (comm.rank + 1), dt)(h, v)
    names, variables = list(leaves), list(leaves.values())

    def step(hook=None):
        h.forward()
        h.backward(function_post_hook=hook)

    for narrowed in (False, True):
        if narrowed:
            a, b, c, d = variables
            share_gradients(a, c)
            share_gradients(b, d)
        for keep_dtype in (False, True):
            for division, scale in ((False, 1.0), (True, 0.1)):
                grads = [v.grad for v in variables]
                run(ck, comm, f"gradients cast during backward, narrowed="
                    f"{narrowed} keep_dtype={keep_dtype} division={division}",
                    variables, names, step,
                    lambda: comm.all_reduce_callback(
                        grads, 8, division=division, scale_grad=scale,
                        keep_dtype=keep_dtype),
                    scale=scale, division=division, keep_dtype=keep_dtype)


def reshaped(ck, comm):
    """W is reset to another shape between steps; the graph is rebuilt on
    it, the gradient list stays the same objects."""
    with nn.parameter_scope("reshaped"):
        W = nn.parameter.get_parameter_or_create(
            "W", (6, 8), np.full((6, 8), 0.1, F32))
        V = nn.parameter.get_parameter_or_create(
            "V", (3,), np.full((3,), 0.2, F32))
    grads = [W.grad, V.grad]
    shapes = [(6, 8), (6, 3), (6, 40), (6, 3)]
    cb_once = comm.all_reduce_callback(grads, 16, division=True)
    for it, shape in enumerate(shapes):
        if W.shape != shape:
            W.reset_shape(shape, force=True)
            W.d = np.full(shape, 0.1, F32)
        x = nn.Variable((2, 6))
        loss = F.sum(F.tanh(F.affine(x, W))) + F.sum(V * V)
        for reuse in (False, True):
            def step(hook=None):
                x.d = contribution(f"reshape/{it}", comm.rank, x.shape, F32,
                                   "rand")
                loss.forward()
                W.grad.zero()
                V.grad.zero()
                loss.backward(function_post_hook=hook)

            run(ck, comm, f"W reshaped to {shape} (step {it}), "
                f"{'reused' if reuse else 'new'} callback", [W, V],
                ["W", "V"], step,
                lambda: cb_once if reuse else comm.all_reduce_callback(
                    grads, 16, division=True))


def main():
    ck = Checker("callback_dtypes")
    comm, _ = make_comm()
    fresh_half_model(ck, comm)
    half_heads_per_rank(ck, comm)
    cast_during_backward(ck, comm)
    reshaped(ck, comm)
    ck.finish()


main()
