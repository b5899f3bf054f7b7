"""A thousand training steps with all_reduce_callback keep memory and
threads flat.

A tiny model trains for 1000 steps in each of three ways: a callback created
once; a new callback every step (pack_size 2 << 20, nnabla-examples' value:
a buffer of that many elements leaked or kept per callback would be 8 MiB
each); and, as in nnabla-examples' dynamic scripts, the graph rebuilt and
the gradient list re-read from nn.get_parameters() every step, with a new
callback. After 100 warm-up steps of each, this process's resident memory
(VmRSS) may grow by at most RSS_SLACK_KIB and its thread count not at all
(one thread leaked per callback, per graph or per backward would add
hundreds). The last step's gradients are checked against a float64
reference, so the loop did reduce.
"""
import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S

from _harness import (Checker, contribution, make_comm, proc_status,
                      scaled_reference, world_gather)

STEPS, WARMUP = 1000, 100
RSS_SLACK_KIB = 8 * 1024
# A leak this large ends the loop early rather than exhausting memory.
RSS_ABORT_KIB = 1024 * 1024


def build():
    x, t = nn.Variable((4, 6)), nn.Variable((4, 2))
    h = F.tanh(PF.affine(x, 5, name="fc1"))
    return x, t, F.mean(F.squared_error(PF.affine(h, 2, name="fc2"), t))


def main():
    ck = Checker("callback_long_run")
    comm, _ = make_comm()
    world = list(range(comm.size))
    np.random.seed(4)
    x, t, loss = build()
    params = nn.get_parameters()
    comm.bcast([p.data for p in params.values()], 0)
    solver = S.Momentum(0.01, 0.9)
    solver.set_parameters(params)
    notes = []
    for mode in ("once", "new", "rebuilt"):
        grads = [p.grad for p in params.values()]
        once = comm.all_reduce_callback(grads, 8, division=True) \
            if mode == "once" else None
        base = None
        for step in range(STEPS):
            if mode == "rebuilt":
                x, t, loss = build()
                grads = [p.grad for p in nn.get_parameters().values()]
            x.d = contribution(f"{mode}/x/{step % 7}", comm.rank, x.shape,
                               np.float32, "rand")
            t.d = contribution(f"{mode}/t/{step % 7}", comm.rank, t.shape,
                               np.float32, "rand")
            loss.forward(clear_no_need_grad=True)
            solver.zero_grad()
            cb = once if once is not None else comm.all_reduce_callback(
                grads, 2 << 20, division=True)
            if step == STEPS - 1:
                # The last step: the callback's result against the
                # gathered local gradients.
                loss.backward()
                gathered = world_gather(grads)
                loss.forward()
                solver.zero_grad()
            loss.backward(clear_buffer=True, function_post_hook=cb)
            if step == STEPS - 1:
                for i, (k, p) in enumerate(params.items()):
                    ref, tol = scaled_reference(
                        [gathered[r][i] for r in world], 1, True)
                    ck.array(p.grad, ref, f"{mode} callback, step {step}: "
                             f"{k}", np.float32, tol)
            solver.update()
            del cb
            if step == WARMUP:
                base = proc_status()
            if step % 50 == 0 and base is not None:
                rss, _ = proc_status()
                # Every rank decides alike, so all leave the loop together.
                grown = max(int(mine[0]) for mine in
                            world_gather([np.array(rss - base[0])]))
                if grown > RSS_ABORT_KIB:
                    ck.fail(f"{mode}: RSS grew by {grown} KiB by step "
                            f"{step}; stopped early")
                    break
        end = proc_status()
        ck.true(end[0] - base[0] <= RSS_SLACK_KIB,
                f"{mode} callback: VmRSS after step {WARMUP} {base[0]} KiB, "
                f"after {STEPS} steps {end[0]} KiB (growth <= "
                f"{RSS_SLACK_KIB} KiB)")
        ck.true(end[1] <= base[1],
                f"{mode} callback: {base[1]} threads after step {WARMUP}, "
                f"{end[1]} after {STEPS} steps")
        notes.append(f"{mode}: rss {base[0]}->{end[0]} KiB, threads "
                     f"{base[1]}->{end[1]}")
    if comm.rank == 0:
        print("; ".join(notes), flush=True)
    ck.finish()


main()
