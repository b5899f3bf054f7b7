"""Bucket hooks: ``hook=`` of gradient_reducer and all_reduce_callback.

- A hook that all-reduces the bucket itself gives bitwise what no hook
  gives: gradients of mixed sizes and dtypes, several pack sizes, with and
  without division and scale_grad, over three iterations; also during
  nnabla's backward (all_reduce_callback), on an MLP.
- A hook that doubles the sum shows it runs once per bucket per iteration:
  every gradient is twice the reference; it saw each bucket index once per
  iteration, in order, only the last with is_last.
- Each bucket's metadata: its gradients tile the flat buffer (offsets back
  to back, starts and counts within each gradient's shape), and the buffer
  holds this rank's elements of them, times scale_grad, as the metadata
  says; every gradient element is in exactly one bucket.
- all_gather returns every rank's array, in rank order; a bucket kept
  after its hook returned refuses its collectives.
- fp16_compress and bf16_compress give bitwise what wire_dtype='float16'
  and 'bfloat16' give.
- DistributedSolver(hook=...) with an all-reducing hook steps bitwise as
  without it, and calls the hook.
"""
import nnabla as nn
import nnabla.solvers as S
import numpy as np

import nncomm
from _harness import Checker, contribution, make_comm, mlp, nd, set_grad

F16, F32 = np.float16, np.float32
SHAPES = [((3, 5), F32), ((700,), F32), ((40,), F16), ((30000,), F32),
          ((1,), F32), ((2, 50), F16)]


def values(rank, it, i, kind="rand"):
    shape, dt = SHAPES[i]
    return contribution(f"hooks{it}-{i}", rank, shape, dt, kind)


def reduce_three_times(comm, pack_size, division, scale, hook,
                       wire_dtype=None):
    """The gradients after each of three iterations of a reducer."""
    grads = [nd(np.zeros(shape, dt)) for shape, dt in SHAPES]
    reducer = comm.gradient_reducer(grads, pack_size, division=division,
                                    scale_grad=scale, hook=hook,
                                    wire_dtype=wire_dtype)
    results = []
    for it in range(3):
        for i in range(len(SHAPES)):
            set_grad(grads[i], values(comm.rank, it, i))
        with reducer:
            for i in reversed(range(len(SHAPES))):
                reducer.ready(i)
        results.append([np.array(g.data) for g in grads])
    return results


def same(ck, got, expected, what):
    for it, (a, b) in enumerate(zip(got, expected)):
        for i, (x, y) in enumerate(zip(a, b)):
            ck.true(x.dtype == y.dtype and np.array_equal(x, y), what,
                    f"iteration {it}, gradient {i}: "
                    f"{np.abs(x.astype(float) - y).max()} off")


def all_reduce_hook(bucket):
    bucket.all_reduce(bucket.buffer)


def check_bitwise(ck, comm):
    for pack_size in (64, 5000, 1 << 20):
        for division, scale in ((False, 1.0), (True, 1.0), (True, 0.5)):
            what = f"pack={pack_size} division={division} scale={scale}"
            plain = reduce_three_times(comm, pack_size, division, scale,
                                       None)
            hooked = reduce_three_times(comm, pack_size, division, scale,
                                        all_reduce_hook)
            same(ck, hooked, plain, f"{what}: a hook that all-reduces")


class Recorder:
    """Doubles each bucket's sum, and records what it was given."""

    def __init__(self, comm, scale):
        self.comm = comm
        self.scale = scale
        self.calls = []
        self.problems = []

    def __call__(self, bucket):
        self.calls.append((bucket.index, bucket.is_last))
        end = 0
        for g in bucket.gradients:
            if g.offset != end:
                self.problems.append(f"bucket {bucket.index}: {g} starts "
                                     f"at {g.offset}, not {end}")
            end = g.offset + g.count
            shape, dt = SHAPES[g.index]
            mine = values(self.comm.rank, self.iteration, g.index)
            expected = (mine.reshape(-1)[g.start:g.start + g.count]
                        .astype(F32) * F32(self.scale))
            if g.shape != shape or not np.array_equal(
                    bucket.buffer[g.offset:end], expected):
                self.problems.append(f"bucket {bucket.index}: {g} does not "
                                     f"hold this rank's elements")
        if end != bucket.buffer.size:
            self.problems.append(f"bucket {bucket.index}: gradients end at "
                                 f"{end} of {bucket.buffer.size}")
        self.elements.extend((g.index, g.start, g.count)
                             for g in bucket.gradients)
        if bucket.rank != self.comm.rank or bucket.size != self.comm.size \
                or bucket.group != "world":
            self.problems.append("rank, size or group wrong")
        return bucket.all_reduce(bucket.buffer.copy()) * 2


def check_every_bucket_once(ck, comm):
    scale = 0.5
    recorder = Recorder(comm, scale)
    grads = [nd(np.zeros(shape, dt)) for shape, dt in SHAPES]
    reducer = comm.gradient_reducer(grads, 5000, scale_grad=scale,
                                    hook=recorder)
    buckets = None
    for it in range(3):
        recorder.iteration = it
        recorder.elements = []
        for i in range(len(SHAPES)):
            set_grad(grads[i], values(comm.rank, it, i))
        start = len(recorder.calls)
        with reducer:
            for i in reversed(range(len(SHAPES))):
                reducer.ready(i)
        calls = recorder.calls[start:]
        buckets = buckets or len(reducer.launch_order)
        ck.equal(calls, [(b, b == buckets - 1) for b in range(buckets)],
                 f"iteration {it}: each bucket once, in order")
        covered = {i: 0 for i in range(len(SHAPES))}
        for i, first, count in sorted(recorder.elements):
            ck.equal(first, covered[i], f"gradient {i}'s pieces back to back")
            covered[i] = first + count
        ck.equal(covered, {i: int(np.prod(s)) for i, (s, _) in
                           enumerate(SHAPES)}, "every element in a bucket")
        for i, (shape, dt) in enumerate(SHAPES):
            total = sum(values(r, it, i).astype(F32) * F32(scale)
                        for r in range(comm.size))
            # MPI may add the ranks' values in another order than here:
            # each addition rounds by at most eps times the sum of |x|.
            got = np.array(grads[i].data).astype(F32)
            bound = 4 * np.finfo(dt).eps * 2 * sum(
                np.abs(values(r, it, i).astype(F32)) * F32(scale)
                for r in range(comm.size))
            ck.true(np.all(np.abs(got - total * 2) <= bound),
                    f"iteration {it}, gradient {i}: the hook's doubled sum",
                    f"{np.abs(got - total * 2).max()} off")
    ck.true(buckets > 2, "several buckets", f"{buckets}")
    ck.equal(recorder.problems, [], "the buckets' metadata")


def check_all_gather(ck, comm):
    gathered = []
    kept = []

    def hook(bucket):
        mine = np.full(3, bucket.rank + 0.5 + bucket.index, F32)
        gathered.append((bucket.index, bucket.all_gather(mine)))
        bucket.all_reduce(bucket.buffer)
        kept.append(bucket)

    grads = [nd(np.zeros(shape, dt)) for shape, dt in SHAPES]
    with comm.gradient_reducer(grads, 5000, hook=hook):
        pass
    for index, rows in gathered:
        expected = np.array([np.full(3, r + 0.5 + index, F32)
                             for r in range(comm.size)])
        ck.true(np.array_equal(rows, expected), f"all_gather of bucket "
                f"{index}", f"{rows}")
    ck.raises(RuntimeError, "during the call", "a bucket kept after its "
              "hook", kept[0].all_reduce, np.zeros(3, F32))


def check_wire_hooks(ck, comm):
    for hook, wire in ((nncomm.hooks.fp16_compress, "float16"),
                       (nncomm.hooks.bf16_compress, "bfloat16")):
        plain = reduce_three_times(comm, 5000, True, 1.0, None, wire)
        hooked = reduce_three_times(comm, 5000, True, 1.0, hook)
        same(ck, hooked, plain, f"{hook.__name__} against wire_dtype={wire}")


def check_callback(ck, comm):
    """During nnabla's backward: the MLP's gradients with and without an
    all-reducing hook."""
    x, t, loss, params = mlp("hooks", 4, 7)
    rng = np.random.default_rng(comm.rank)
    x.d = rng.standard_normal(x.shape)
    t.d = rng.standard_normal(t.shape)
    grads = [v.grad for v in params.values()]
    results = []
    calls = []

    def hook(bucket):
        calls.append(bucket.index)
        bucket.all_reduce(bucket.buffer)

    for hook in (None, hook):
        loss.forward()
        for g in grads:
            g.zero()
        cb = comm.all_reduce_callback(grads, 40, division=True, hook=hook)
        loss.backward(communicator_callbacks=cb)
        results.append([np.array(g.data) for g in grads])
    same(ck, [results[1]], [results[0]], "all_reduce_callback with a hook")
    ck.true(len(calls) > 1 and calls == list(range(len(calls))),
            "the callback's hook saw every bucket", f"{calls}")


def check_solver(ck, comm):
    calls = []

    def hook(bucket):
        calls.append(bucket.index)
        bucket.all_reduce(bucket.buffer)

    found = []
    initial = None
    for scope, h in (("plain", None), ("hooked", hook)):
        x, t, loss, params = mlp(scope, 4, 11)
        # nnabla's initializers draw from nnabla.random, not numpy's seed.
        initial = initial or {k: v.d.copy() for k, v in params.items()}
        for k, v in params.items():
            v.d = initial[k]
        solver = nncomm.DistributedSolver(S.Sgd(0.1), comm, hook=h,
                                          pack_size=50)
        solver.set_parameters(params)
        rng = np.random.default_rng(comm.rank)
        for _ in range(3):
            x.d = rng.standard_normal(x.shape)
            t.d = rng.standard_normal(t.shape)
            loss.forward()
            solver.zero_grad()
            solver.backward(loss)
            solver.update()
        found.append([np.array(v.d) for v in params.values()])
    ck.true(all(np.array_equal(a, b) for a, b in zip(*found)),
            "DistributedSolver with an all-reducing hook steps as without")
    ck.true(len(calls) > 3, "DistributedSolver calls the hook", f"{calls}")


def main():
    ck = Checker("bucket_hooks")
    comm, _ = make_comm()
    check_bitwise(ck, comm)
    check_every_bucket_once(ck, comm)
    check_all_gather(ck, comm)
    check_wire_hooks(ck, comm)
    with nn.parameter_scope("callback"):
        check_callback(ck, comm)
    check_solver(ck, comm)
    ck.finish()


if __name__ == "__main__":
    main()
