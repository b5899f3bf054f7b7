"""A backward that raises on ONE rank only (a user hook chained before the
callback): that rank raises its own exception, every other rank raises
"another rank ... failed" instead of waiting, and the next backwards with
the same callback reduce correctly on every rank.

nncomm.chain_hooks tells the callback that backward is raising, so the
failed rank closes that backward at once (the others wait in its last call
only until then), and the next backward starts without a warning.
"""
import warnings

import numpy as np

import nncomm

from _harness import Checker, exception_chain, make_comm, three_layer_mlp


class OnlyHere(Exception):
    pass


def main():
    ck = Checker("callback_one_rank_fails")
    comm, _ = make_comm()
    x, t, loss, names, variables = three_layer_mlp(7)
    grads = [p.grad for p in variables]
    cb = comm.all_reduce_callback(grads, 4, division=True)

    def step(user_hook=None):
        x.d = np.full(x.shape, comm.rank + 1.0, np.float32)
        t.d = np.zeros(t.shape, np.float32)
        loss.forward()
        for p in variables:
            p.grad.zero()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss.backward(function_post_hook=nncomm.chain_hooks(user_hook, cb))
        return [str(w.message) for w in caught]

    calls = [0]

    def fail_on_rank0(f):
        calls[0] += 1
        if comm.rank == 0 and calls[0] == 2:
            raise OnlyHere("rank 0 only")

    try:
        step(fail_on_rank0)
        ck.fail("the failing backward raised nowhere")
    except Exception as e:
        chain = exception_chain(e)
        if comm.rank == 0:
            ck.true("OnlyHere" in chain, "rank 0 raises its own exception",
                    chain)
        else:
            ck.true("another rank" in chain,
                    "the other ranks learn that a rank failed", chain)

    for it in range(3):
        messages = step()
        ck.true(not messages, f"step {it} after the failure: no warning",
                f"warnings {messages}")
        got = [np.array(g.data) for g in grads]
        loss.forward()
        for p in variables:
            p.grad.zero()
        loss.backward()
        comm.all_reduce(grads, division=True)
        for name, g, r in zip(names, got, grads):
            ck.array(r, g, f"step {it} after the failure: {name} equals "
                           f"backward + all_reduce", np.float32)
    ck.finish()


main()
