"""A backward that raises part-way (a user hook chained before the
callback raises, on every rank) leaves the communicator and the callback
usable: the next backwards with the SAME callback object, and with a new
one, reduce correctly.

nnabla turns the hook's exception into a SystemError from backward; the
callback saw only the first functions, so the gradients of that backward
are not reduced, and nothing about that is checked here. What is checked
is the iterations after it.
"""
import numpy as np


import nncomm

from _harness import (Checker, contribution, exception_chain, make_comm,
                      scaled_reference, three_layer_mlp, world_gather)


class UserHookFailed(Exception):
    pass


def main():
    ck = Checker("callback_after_failure")
    comm, _ = make_comm()
    rank, world = comm.rank, list(range(comm.size))
    x, t, loss, names, variables = three_layer_mlp(6)
    grads = [p.grad for p in variables]

    def backward(key, hook=None):
        x.d = contribution(key + "/x", rank, x.shape, np.float32, "rand")
        t.d = contribution(key + "/t", rank, t.shape, np.float32, "rand")
        loss.forward()
        for p in variables:
            p.grad.zero()
        loss.backward(function_post_hook=hook)

    for reuse in (True, False):
        cb = comm.all_reduce_callback(grads, 4, division=True)
        calls = [0]

        def failing(f):
            calls[0] += 1
            if calls[0] == 3:
                raise UserHookFailed("the user's hook fails")

        try:
            backward(f"fail/{reuse}", nncomm.chain_hooks(failing, cb))
            ck.fail("premise: a backward whose hook raises raises")
        except Exception:
            ck.count += 1  # the premise held
        for it in range(3):
            key = f"after/{reuse}/{it}"
            backward(key)
            gathered = world_gather(grads)
            what = (f"{'the same' if reuse else 'a new'} callback, "
                    f"iteration {it + 1} after a backward that raised")
            try:
                backward(key, cb if reuse else
                         comm.all_reduce_callback(grads, 4, division=True))
            except Exception as e:
                ck.fail(what, f"backward raised {exception_chain(e)}")
                continue
            for i, p in enumerate(variables):
                ref, tol = scaled_reference([gathered[r][i] for r in world],
                                            1, True)
                ck.array(p.grad, ref, f"{what}: {names[i]}", np.float32,
                         tol)
    ck.finish()


main()
