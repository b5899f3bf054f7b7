"""Communicator.gradient_reducer: the callback's engine driven by hand.

- Gradients of mixed sizes and dtypes (one of 12,000 bytes, which the
  test's NNCOMM_DIRECT_BYTES=8192 has reduced where it lies), made ready
  in another random order on every rank (some never: finish() reduces
  them), over several iterations with new values: each holds what
  all_reduce of the same values gives, bitwise (the same dtype reduced
  over the same MPI), under several pack sizes, keep_dtype, scale_grad
  and division, on the world and on a sub-group.
- With a priority ("forward", or numbers with ties) the results are the
  same bitwise, and the buckets go out highest priority first, ties in
  plan order, on every rank, whatever order each rank makes its
  gradients ready in (launch_order).
- Misuse raises a clear exception: ready() twice fails the iteration on
  every rank, as an exception inside ``with reducer:`` does; ready() out of range or outside an iteration, begin() twice,
  a bad order; one rank's fail() makes finish() raise on every rank;
  ranks with different gradients are refused on every rank.
"""
import numpy as np
from mpi4py import MPI

from _harness import Checker, contribution, make_comm, nd, set_grad

F16, F32 = np.float16, np.float32
SHAPES = [((3, 5), F32), ((700,), F32), ((40,), F16), ((3000,), F32),
          ((1,), F32), ((2, 50), F16)]


def values(rank, it, i):
    shape, dt = SHAPES[i]
    return contribution(f"reducer{it}-{i}", rank, shape, dt)


def run(ck, comm, group, ranks, pack_size, keep_dtype, scale, division,
        priority):
    what = (f"group={group} pack={pack_size} keep={keep_dtype} "
            f"scale={scale} division={division} priority={priority}")
    rank = comm.rank
    grads = [nd(np.zeros(shape, dt)) for shape, dt in SHAPES]
    reference = [nd(np.zeros(shape, dt)) for shape, dt in SHAPES]
    reducer = comm.gradient_reducer(grads, pack_size, division=division,
                                    group=group, scale_grad=scale,
                                    keep_dtype=keep_dtype, priority=priority)
    rng = np.random.default_rng(rank * 31 + pack_size)
    for it in range(3):
        for i in range(len(SHAPES)):
            set_grad(grads[i], values(rank, it, i))
        reducer.begin()
        # Each rank its own order; the last gradient is left to finish().
        for i in rng.permutation(len(SHAPES) - 1):
            reducer.ready(int(i))
        reducer.finish()
        # The reference: the same values, scaled on the host in the wire
        # dtype, through all_reduce.
        for i, (shape, dt) in enumerate(SHAPES):
            wire = dt if keep_dtype else F32
            set_grad(reference[i],
                     (values(rank, it, i).astype(wire) * wire(scale)))
        comm.all_reduce(reference, division=division, group=group)
        for i, (shape, dt) in enumerate(SHAPES):
            expected = np.array(reference[i].data).astype(dt)
            ck.array(grads[i], expected, f"{what} iteration {it} [{i}]", dt)


def launch_order(ck, comm):
    """Gradient 1 spans all four buckets, (0, 1), (1), (1), (1, 2): they go
    out highest priority first on every rank, ties in plan order, whether
    a rank makes gradient 1 ready last (all four ready at once) or first
    (the middle two ready before the others)."""
    grads = [nd(np.full(n, comm.rank + 1.0, F32)) for n in (1, 38, 1)]
    total = sum(range(1, comm.size + 1))
    plan = [(0, 1), (1,), (1,), (1, 2)]
    for priority, expected in [
            (None, plan),
            ("forward", [(1, 2), (0, 1), (1,), (1,)]),
            ([5, 0, 9], [(1, 2), (0, 1), (1,), (1,)]),
            ([4, 1, 4], [(0, 1), (1, 2), (1,), (1,)])]:
        reducer = comm.gradient_reducer(grads, 10, order=[0, 1, 2],
                                        priority=priority)
        reducer.begin()
        for i in (0, 2, 1) if comm.rank % 2 == 0 else (1, 2, 0):
            reducer.ready(i)
        reducer.finish()
        ck.equal(reducer.launch_order, expected,
                 f"launch order, priority={priority}")
        everywhere = MPI.COMM_WORLD.allgather(reducer.launch_order)
        ck.true(all(o == everywhere[0] for o in everywhere),
                f"launch order alike on every rank, priority={priority}",
                str(everywhere))
        for x in grads:
            ck.array(x, np.full(x.size, total, F32),
                     f"all at once, priority={priority}")
            set_grad(x, np.full(x.size, comm.rank + 1.0, F32))


def misuse(ck, comm):
    grads = [nd(np.ones(5, F32)), nd(np.ones(9, F32))]
    reducer = comm.gradient_reducer(grads, 4)
    ck.raises(RuntimeError, "begin() first", "ready() outside an iteration",
              reducer.ready, 0)
    ck.raises(RuntimeError, "begin() first", "finish() outside",
              reducer.finish)
    reducer.begin()
    ck.raises(RuntimeError, "still under way", "begin() twice",
              reducer.begin)
    ck.raises(IndexError, "out of range", "ready(2)", reducer.ready, 2)
    reducer.ready(1)
    if comm.rank == 0:
        ck.raises(RuntimeError, "twice", "ready() twice", reducer.ready, 1)
    ck.raises(RuntimeError, "made ready twice" if comm.rank == 0 else
              "another rank", "finish() after ready() twice",
              reducer.finish)
    # The reducer goes on after a failed iteration.
    for x in grads:
        set_grad(x, np.full(x.size, comm.rank + 1, F32))
    reducer.begin()
    reducer.finish()
    total = sum(range(1, comm.size + 1))
    for i, x in enumerate(grads):
        ck.array(x, np.full(x.size, total, F32), f"after a failure [{i}]")

    reducer.begin()
    if comm.rank == comm.size - 1:
        reducer.fail("the loss was NaN here")
    ck.raises(RuntimeError, "the loss was NaN" if comm.rank == comm.size - 1
              else "another rank", "fail() on the last rank",
              reducer.finish)

    # An exception inside `with reducer:` fails the iteration on every
    # rank and propagates on its own; the next iteration goes on.
    def raising_iteration():
        with reducer:
            reducer.ready(0)
            if comm.rank == 0:
                raise KeyError("in the training step")
    if comm.rank == 0:
        ck.raises(KeyError, "training step", "with: raised here",
                  raising_iteration)
    else:
        ck.raises(RuntimeError, "another rank", "with: raised elsewhere",
                  raising_iteration)
    for x in grads:
        set_grad(x, np.full(x.size, 2.0, F32))
    with reducer:
        reducer.ready(1)
    for i, x in enumerate(grads):
        ck.array(x, np.full(x.size, 2.0 * comm.size, F32),
                 f"with: after a raising iteration [{i}]")

    # The wire dtype: 1 + 2**-12 is 1 in float16, 1 + 2**-9 is 1 in
    # bfloat16, and both are exact in float32 and under keep_dtype.
    n = comm.size
    for wire, keep, value, total in [
            ("float16", False, 1 + 2 ** -12, n),
            ("bfloat16", False, 1 + 2 ** -9, n),
            ("float32", False, 1 + 2 ** -12, n * (1 + 2 ** -12)),
            ("float16", True, 1 + 2 ** -12, n * (1 + 2 ** -12))]:
        x = nd(np.full(10, value, F32))
        r = comm.gradient_reducer([x], 4, keep_dtype=keep, wire_dtype=wire)
        with r:
            pass
        ck.array(x, np.full(10, total, F32),
                 f"wire_dtype={wire} keep_dtype={keep}")
    ck.raises(ValueError, "wire_dtype must be", "wire_dtype int32",
              comm.gradient_reducer, grads, 4, wire_dtype="int32")

    ck.raises(ValueError, "order must list", "a bad order",
              comm.gradient_reducer, grads, 4, order=[0, 0])
    for bad, error in (("backward", ValueError), ([1], ValueError),
                       ([1, float("nan")], ValueError), (3, TypeError),
                       ([1, "x"], TypeError)):
        ck.raises(error, "priority must be", f"priority={bad!r}",
                  comm.gradient_reducer, grads, 4, priority=bad)
    ck.raises(TypeError, "float32, float16 or float64", "integer gradients",
              comm.gradient_reducer, [nd(np.ones(3, np.int32))], 4)
    ck.raises(ValueError, "positive", "pack_size 0",
              comm.gradient_reducer, grads, 0)
    mine = [nd(np.ones(5 + comm.rank, F32))]
    if comm.size > 1:
        ck.raises(ValueError, "disagree", "ranks with different gradients",
                  comm.gradient_reducer, mine, 4)
        ck.raises(ValueError, "disagree", "ranks with different priorities",
                  comm.gradient_reducer, grads, 4,
                  priority=[0, comm.rank])


def main():
    ck = Checker("reducer")
    comm, _ = make_comm()
    ck.equal(comm.transport, "mpi", "transport of host memory")
    groups = {"world": list(range(comm.size))}
    if comm.size >= 2:
        ranks = list(range(comm.size))[::-1][:2]
        comm.new_group(("pair", ranks))
        groups["pair"] = ranks
    for pack_size, keep_dtype, scale, division, priority in [
            (64, False, 1.0, True, None), (1000, True, 0.5, False, None),
            (7, True, 2.0, True, None), (64, False, 1.0, True, "forward"),
            (300, True, 2.0, True, [2, -1, 2, 0.5, 3, -1])]:
        for group, ranks in groups.items():
            if comm.rank in ranks:
                run(ck, comm, group, ranks, pack_size, keep_dtype, scale,
                    division, priority)
    launch_order(ck, comm)
    misuse(ck, comm)
    ck.finish()


main()
