"""all_reduce_callback gives, bit for bit, what all_reduce gives after a
plain backward whose gradients were first multiplied by scale_grad, in
every dtype path, through both routes (function_post_hook= and nnabla's
communicator_callbacks=, alone or beside a function_post_hook of the
user's, which still sees every function):

- keep_dtype=True: each gradient scaled in its own dtype, then
  ``all_reduce(grads, division)``;
- keep_dtype=False (float32 on the wire): each gradient converted to
  float32 and scaled there, all-reduced as float32, the result rounded to
  the gradient's dtype.

The gradients are random, float32 and float16, written by a Python
function during backward (so they become float16 at run time), as arrays
of their own or as narrowed views of two shared arrays; scale_grad 1 and
0.1, sum and mean.
"""
import numpy as np

import nnabla as nn
from nnabla.ext_utils import get_extension_context

from _harness import (Checker, GradientWriter, contribution,
                      exception_chain, make_comm, nd, share_gradients)

F16, F32 = np.float16, np.float32
SHAPES = {"a": (2, 3, 4), "b": (5, 1), "c": (), "d": (1, 3)}
DTYPES = {"a": F32, "b": F16, "c": F32, "d": F16}


def given_grad(ctx, name, values):
    """Writes `values[name]` into the gradient of its second input."""
    def write(i, grad):
        if i == 1:
            grad.cast(values[name].dtype, ctx)
            grad.data[...] = values[name]
    return GradientWriter(ctx, write)


def graph(ctx, values, narrowed):
    x = nn.Variable((4,))
    leaves = {name: nn.Variable(shape, need_grad=True)
              for name, shape in SHAPES.items()}
    if narrowed:
        a, b, c, d = leaves.values()
        share_gradients(a, c)
        share_gradients(b, d)
    h = x
    for name, v in leaves.items():
        h = given_grad(ctx, name, values)(h, v)
    return h, list(leaves.values())


def scaled(value, scale, dtype):
    return (value.astype(F32) * F32(scale)).astype(dtype)


def main():
    ck = Checker("callback_bitwise")
    comm, _ = make_comm()
    ctx = get_extension_context("cpu")
    values = {}
    for narrowed in (False, True):
        h, variables = graph(ctx, values, narrowed)
        grads = [v.grad for v in variables]
        for keep_dtype in (False, True):
            for division in (False, True):
                for scale in (1.0, 0.1):
                    for route in ("hook", "callbacks", "both"):
                        what = (f"narrowed={narrowed} keep_dtype={keep_dtype}"
                                f" division={division} scale={scale} {route}")
                        for name, shape in SHAPES.items():
                            values[name] = contribution(
                                f"{what}/{name}", comm.rank, shape,
                                DTYPES[name], "rand")
                        # The reference: the same backward, then all_reduce.
                        h.forward()
                        h.backward()
                        if keep_dtype:
                            for g in grads:
                                g.data[...] = scaled(g.data, scale, g.dtype)
                            comm.all_reduce(grads, division=division)
                            expected = [g.data.copy() for g in grads]
                        else:
                            wide = [nd(scaled(g.data, scale, F32))
                                    for g in grads]
                            comm.all_reduce(wide, division=division)
                            expected = [w.data.astype(g.dtype)
                                        for w, g in zip(wide, grads)]
                        cb = comm.all_reduce_callback(
                            grads, 8, division=division, scale_grad=scale,
                            keep_dtype=keep_dtype)
                        h.forward()
                        seen = []
                        try:
                            if route == "hook":
                                h.backward(function_post_hook=cb)
                            elif route == "callbacks":
                                h.backward(communicator_callbacks=cb)
                            else:
                                h.backward(communicator_callbacks=[cb],
                                           function_post_hook=seen.append)
                        except Exception as e:
                            ck.fail(what, exception_chain(e))
                            continue
                        if route == "both":
                            ck.equal(len(seen), len(SHAPES),
                                     f"{what}: the user's hook saw every "
                                     f"function")
                        for name, g, want in zip(SHAPES, grads, expected):
                            got = g.data.reshape(-1)
                            ck.true(g.dtype == want.dtype and np.array_equal(
                                got.view(np.uint8),
                                want.reshape(-1).view(np.uint8)),
                                f"{what}: {name} bit for bit",
                                f"{got!r} != {want!r}")
    ck.finish()


main()
