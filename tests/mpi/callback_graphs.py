"""all_reduce_callback on graphs the way nnabla users build them
(graph_catalogue.py: stop-gradient GAN graphs, frozen layers, persistent
and unlinked variables, shared weights, several roots, a loss reaching no
registered gradient, need_grad alternating between steps; graphs whose
backward reaches other parameters on other ranks) gives what a plain
backward followed by all_reduce gives, on every rank, every step, with no
warning.

Each step: rank-dependent inputs, a plain backward whose gradients every
rank gathers through mpi4py (the reference), then the same backward with
the callback (a new one per step, or one reused, with priority="forward"
too), pack sizes from one element to far above the model.

Usage: callback_graphs.py [ROUTE]: the callback passed as
function_post_hook ("hook", the default) or in communicator_callbacks
("callbacks"); "python" passes it as function_post_hook with nnabla taken
for a version nncomm does not know the types of, where every gradient is
read through Python.
"""
import sys
import warnings

import nnabla
import numpy as np

from _harness import (Checker, contribution, exception_chain, make_comm,
                      scaled_reference, world_gather)
from graph_catalogue import BY_RANK, CATALOGUE

PACKS = (1, 8, 2 << 20)
STEPS = 4
# Callbacks made anew each step or once; with buckets in backward's order,
# or in the next forward's.
MODES = ((False, None), (True, None), (True, "forward"))
ROUTE = sys.argv[1] if len(sys.argv) > 1 else "hook"
if ROUTE == "python":
    nnabla.__version__ = "0.0.unknown"  # read at nncomm's first use of it
    ROUTE = "hook"


def main():
    ck = Checker("callback_graphs")
    comm, _ = make_comm()
    if nnabla.__version__ == "0.0.unknown":
        from nncomm._nncomm import nnabla_types_refused
        ck.true("0.0.unknown" in nnabla_types_refused(),
                "nnabla's types refused", nnabla_types_refused())
    world = list(range(comm.size))
    for g in [build() for build in CATALOGUE] + \
            [build(comm.rank) for build in BY_RANK]:
        for reuse, priority in MODES:
            for pack in PACKS:
                def made():
                    return comm.all_reduce_callback(
                        g.grads(), pack, division=True, scale_grad=0.5,
                        priority=priority)
                once = made() if reuse else None
                for step in range(STEPS):
                    key = f"{g.name}/{reuse}/{priority}/{pack}/{step}"
                    g.next_step()
                    g.feed(lambda name, shape: contribution(
                        f"{key}/{name}", comm.rank, shape, np.float32,
                        "rand") / 4)
                    g.run()
                    gathered = world_gather(g.grads())
                    cb = once if reuse else made()
                    what = (f"{g.name} pack_size={pack} step {step} "
                            f"({'reused' if reuse else 'new'} callback, "
                            f"priority={priority})")
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        try:
                            g.run(cb, ROUTE)
                        except Exception as e:
                            ck.fail(what, f"backward raised "
                                          f"{exception_chain(e)}")
                            continue
                    ck.true(not caught, f"{what}: no warning",
                            str([str(w.message) for w in caught]))
                    for i, p in enumerate(g.params):
                        ref, tol = scaled_reference(
                            [gathered[r][i] for r in world], 0.5, True)
                        ck.array(p.grad, ref, f"{what}: {g.names[i]}",
                                 np.float32, tol)
    ck.finish()


main()
