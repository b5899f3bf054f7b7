"""Two callbacks on the SAME group in one backward, each on its own part of
the gradients, combined with nncomm.chain_hooks (nnabla's backward takes a
list of communicator callbacks for this; the same split is natural for
different pack sizes or scale_grad per parameter set).

Each callback's gradients must be reduced as all_reduce would reduce them;
the two callbacks' messages must not be matched with each other across
ranks. Twenty iterations per setting with rank-dependent inputs; a
backward that raises is recorded as a failure (every rank raising alike
keeps the ranks in step).
"""
import numpy as np


import nncomm

from _harness import (Checker, contribution, exception_chain, make_comm,
                      scaled_reference, three_layer_mlp, world_gather)


def main():
    ck = Checker("callback_one_group_twice")
    comm, _ = make_comm()
    rank, world = comm.rank, list(range(comm.size))
    x, t, loss, names, variables = three_layer_mlp(5)

    def backward(hook=None):
        loss.forward()
        for p in variables:
            p.grad.zero()
        loss.backward(function_post_hook=hook)

    for split, packs in ((3, (2, 2)), (3, (1000, 1000)), (1, (4, 16))):
        for it in range(20):
            key = f"{split}/{packs}/{it}"
            x.d = contribution(key + "/x", rank, x.shape, np.float32, "rand")
            t.d = contribution(key + "/t", rank, t.shape, np.float32, "rand")
            backward()
            gathered = world_gather([p.grad for p in variables])
            grads = [p.grad for p in variables]
            what = (f"callbacks on world for gradients [:{split}] (pack_size "
                    f"{packs[0]}) and [{split}:] (pack_size {packs[1]}), "
                    f"iteration {it}")
            try:
                backward(nncomm.chain_hooks(
                    comm.all_reduce_callback(grads[:split], packs[0]),
                    comm.all_reduce_callback(grads[split:], packs[1])))
            except Exception as e:
                ck.fail(what, f"backward raised {exception_chain(e)}")
                continue
            for i, p in enumerate(variables):
                ref, tol = scaled_reference([gathered[r][i] for r in world])
                ck.array(p.grad, ref, f"{what}: {names[i]}", np.float32, tol)
    ck.finish()


main()
