"""Bucket hooks that go wrong raise nncomm.BucketHookError on every rank,
promptly (the test runs with NNCOMM_TIMEOUT small), and the reducer works
again at the next iteration:

- a hook returning an array of the wrong shape, or of the wrong dtype, or
  not an array;
- a hook raising on the last rank only, before its collective, and after
  one (the others are then inside their next one): the message names the
  hook and that rank, and on that rank the error is chained to the hook's;
- a hook making one collective more on rank 0 than on the others;
- a non-callable hook is refused when the reducer is made (TypeError), as
  it is by all_reduce_callback and DistributedSolver.
"""
import time

import nnabla.solvers as S
import numpy as np

import nncomm
from _harness import Checker, make_comm, nd

SHAPES = [(4, 6), (30,), (7,)]


class Case:
    def __init__(self, name, hook, text, culprit=None):
        self.name = name
        self.hook = hook
        self.text = text
        self.culprit = culprit  # the rank that raised, where one did


def cases(comm):
    last = comm.size - 1
    rank = comm.rank

    def wrong_shape(b):
        return np.zeros(b.buffer.size + 1, b.buffer.dtype)

    def wrong_dtype(b):
        return b.buffer.astype(np.float64)

    def not_an_array(b):
        return [0.0] * b.buffer.size

    def raises_first(b):
        if rank == last and b.index == 1:
            raise KeyError("boom before")
        b.all_reduce(b.buffer)

    def raises_between(b):
        b.all_reduce(b.buffer)
        if rank == last and b.index == 1:
            raise ValueError("boom between")
        b.all_reduce(b.buffer)

    def one_more(b):
        b.all_reduce(b.buffer)
        if rank == 0:
            b.all_reduce(b.buffer)

    found = [Case("wrong shape", wrong_shape, "shape"),
             Case("wrong dtype", wrong_dtype, "dtype float32"),
             Case("not an array", not_an_array, "a list"),
             Case("raises before", raises_first, "boom before", last),
             Case("raises between", raises_between, "boom between", last)]
    if comm.size > 1:
        found.append(Case("one more collective", one_more,
                          "different collectives"))
    return found


def world_rank_named(message, rank):
    return f"world rank {rank}" in message or f"[{rank}]" in message


def main():
    ck = Checker("bucket_hook_errors")
    comm, _ = make_comm()
    grads = [nd(np.ones(s, np.float32)) for s in SHAPES]
    for case in cases(comm):
        reducer = comm.gradient_reducer(grads, 16, hook=case.hook)
        started = time.monotonic()
        try:
            with reducer:
                pass
            ck.fail(f"{case.name}: no error")
        except nncomm.BucketHookError as e:
            message = str(e)
            ck.true(case.text in message or case.culprit is not None and
                    comm.rank != case.culprit, f"{case.name}: says why",
                    message)
            ck.true(case.hook.__name__ in message,
                    f"{case.name}: names the hook", message)
            if case.culprit is not None:
                ck.true(world_rank_named(message, case.culprit),
                        f"{case.name}: names the rank", message)
                if comm.rank == case.culprit:
                    ck.true(case.text in str(e.__cause__),
                            f"{case.name}: chained to the hook's", message)
        except Exception as e:
            ck.fail(f"{case.name}: raised {type(e).__name__}: {e}")
        ck.true(time.monotonic() - started < 2, f"{case.name}: promptly")
        # The next iteration, with a good hook, works.
        for g in grads:
            g.fill(1)
        with comm.gradient_reducer(
                grads, 16, hook=lambda b: b.all_reduce(b.buffer)):
            pass
        ck.true(all(np.all(np.array(g.data) == comm.size) for g in grads),
                f"{case.name}: the next reduction works")
    ck.raises(TypeError, "callable", "a non-callable hook",
              comm.gradient_reducer, grads, 16, hook=3)
    ck.raises(TypeError, "callable", "a non-callable callback hook",
              comm.all_reduce_callback, grads, 16, hook="fp16")
    ck.raises(TypeError, "callable", "a non-callable solver hook",
              nncomm.DistributedSolver, S.Sgd(0.1), comm, hook=1)
    ck.raises(ValueError, "compression", "a hook with compression",
              nncomm.DistributedSolver, S.Sgd(0.1), comm,
              compression=nncomm.Compression.fp16,
              hook=nncomm.hooks.fp16_compress)
    ck.finish()


if __name__ == "__main__":
    main()
