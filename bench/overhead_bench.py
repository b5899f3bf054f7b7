"""Where the per-call overheads come from, in one process.

    .venv/bin/python bench/overhead_bench.py

Prints, best of 5 rounds (15 for the backward timings, whose differences
carry the noise of two measurements):
- one ``NdArray.data_ptr(dtype, ctx)`` call (nncomm needs one per array per
  collective, and one per gradient per backward in the callback);
- on a chain of 1,000 ``Add2`` functions with one parameter each, the
  backward time per function over a backward with no hook, for: a trivial
  Python hook (nnabla's dispatch alone), a hook that only looks the function
  up and calls ``data_ptr`` on the gradients it wrote (the floor of any
  Python hook that reads the gradients), and nncomm's
  ``all_reduce_callback`` passed both ways nnabla takes it: as
  ``function_post_hook=`` and as ``communicator_callbacks=`` (nnabla's C++
  calls nncomm's C++, with no Python per function).

Each figure is a difference of two times of the same chain, so the noise of
a busy machine lands on it whole: compare figures of one run.
"""
import time

import nnabla as nn
import nnabla.functions as F
import numpy as np
from nnabla.ext_utils import get_extension_context

import nncomm.communicators as C
from nncomm.nnabla_adapter.graph import analyze

N = 1000


def best(fn, iters, rounds=5):
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - start) / iters)
    return min(times)


def main():
    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()

    x = nn.NdArray.from_numpy_array(np.ones(1024, np.float32))
    dt = x.dtype
    print(f"data_ptr            {best(lambda: x.data_ptr(dt, ctx), 100000) * 1e6:6.2f} us per call")

    h = nn.Variable((4, 16))
    h.d = 0.1
    for i in range(N):
        p = nn.parameter.get_parameter_or_create(
            f"p{i}", (4, 16), np.zeros((4, 16), np.float32))
        h = F.add2(h, p)
    loss = F.sum(h)
    grads = [p.grad for p in nn.get_parameters().values()]
    loss.forward()
    consumers = analyze(loss.parent, {g: i for i, g in enumerate(grads)}).consumers

    def per_function(hook):
        return best(lambda: loss.backward(function_post_hook=hook), 20,
                    15) / (N + 1) * 1e6

    def lookup_and_pointer(f):
        for i in consumers[f][1]:
            g = grads[i]
            g.data_ptr(g.dtype, ctx)

    def per_function_callbacks(callbacks):
        return best(lambda: loss.backward(communicator_callbacks=callbacks),
                    20, 15) / (N + 1) * 1e6

    cb = comm.all_reduce_callback(grads, 2 << 20)
    loss.backward(function_post_hook=cb)
    none = per_function(None)
    print(f"backward, no hook   {none:6.2f} us per function")
    for name, hook in [("trivial hook", lambda f: None),
                       ("lookup + data_ptr", lookup_and_pointer),
                       ("nncomm callback", cb)]:
        print(f"{name:<19} +{per_function(hook) - none:5.2f} us per function")
    print(f"{'nncomm, nnabla C++':<19} "
          f"+{per_function_callbacks(cb) - none:5.2f} us per function "
          f"(communicator_callbacks=)")


if __name__ == "__main__":
    main()
