"""Collectives on GPU arrays (objects with __cuda_array_interface__), with
no nnabla imported.

MODE refused (any machine): arrays described by the interface over host
memory; bad arrays raise before any rank communicates, and a valid call
raises RuntimeError on every rank with the reason the GPU path cannot run
here (a build without CUDA, or the CUDA runtime's own words: no driver, no
device, not device memory), never a hang.

MODE cupy (a GPU machine with CuPy): every collective on CuPy arrays
against numpy (alltoall and all_gather of sizes that differ between ranks
included), on the transport NNCOMM_GPU_TRANSPORT chooses.

MODE emulated (a build over the fake CUDA runtime: setup.py's
NNCOMM_FAKE_CUDA=1; tests/test_gpu_python_emulated.py): the same
collectives on the fake's device memory (fake_device.py), and the engine,
wire dtypes, float64 and device checks, through the Python layer.

MODE one_rank_refused (the same build): rank 0 alone passes an array on
another device; every rank prints what it raised, and how soon.

MODE one_rank_ended (the same build, 2 ranks): rank 1's script ends one
all_reduce before rank 0's; rank 0 prints what it raised, and how soon.

Prints "gpu_arrays: N checks passed on R ranks" from rank 0.
"""
import os
import sys
import time
import types
import warnings

import numpy as np
from mpi4py import MPI

sys.modules["nnabla"] = None  # the GPU path must not need it
import nncomm  # noqa: E402

MODE = sys.argv[1]
world = MPI.COMM_WORLD
RANK, SIZE = world.rank, world.size
failures = []
checks = 0


def check(ok, what):
    global checks
    checks += 1
    if not ok:
        failures.append(f"[rank {RANK}] FAIL {what}")
        print(failures[-1], file=sys.stderr, flush=True)


def raises(kind, words, call, what):
    try:
        call()
    except kind as e:
        check(words in str(e), f"{what}: {e!r} lacks {words!r}")
    else:
        check(False, f"{what}: no {kind.__name__}")


class HostDescribed:
    """Host memory described as GPU memory: what the binding reads."""

    def __init__(self, array, stream=1, readonly=False, strides=None):
        self.array = array
        self.__cuda_array_interface__ = {
            "shape": array.shape, "typestr": array.dtype.str,
            "data": (array.ctypes.data, readonly), "version": 3,
            "strides": strides, "stream": stream}


def device_timeline(comm, xp, write):
    """While a timeline records, each bucket of a GPU engine gets device
    spans on the "device" track: wait_gradients and reduce for every
    bucket, pack and unpack for a staged one, in order, each bucket once
    per iteration and every gradient byte in one reduce span. An
    iteration's spans are written when the next begins, so of two
    iterations the first is checked (the second may be, too)."""
    import tempfile
    from nncomm import timeline, timeline_summary

    path = world.bcast(os.path.join(tempfile.mkdtemp(), "device.json")
                       if RANK == 0 else None)
    # 2048 x 256 float32 is a bucket of its own, reduced in place.
    rows = [1, 64, 2048, 40]
    grads = [xp.zeros((r, 256), np.float32) for r in rows]
    reducer = comm.gradient_reducer(grads, 5000, division=True)
    comm.start_timeline(path)
    for it in range(2):
        reducer.begin()
        for k in reversed(range(len(rows))):
            write(grads[k], np.full((rows[k], 256), it + 1, np.float32))
            reducer.ready(k)
        reducer.finish()
    comm.stop_timeline()
    # The 2 MiB one alone splits into 105 buckets of 5000 elements; on the
    # CUDA IPC transport, whose buckets are merged up to
    # NNCOMM_IPC_BUCKET_BYTES (32 MiB), all go out as one.
    buckets = len(reducer.launch_order)
    merged = comm.transport == "ipc" and \
        int(os.environ.get("NNCOMM_IPC_BUCKET_BYTES", 32 << 20)) > 0
    check(buckets == 1 if merged else buckets > 100,
          f"{buckets} buckets on transport {comm.transport}")
    if RANK != 0:
        return
    events = [e for e in timeline.load(path) if e.get("cat") == "device"]
    for r in range(SIZE):
        spans = {}
        for e in events:
            if e["pid"] == r:
                spans.setdefault(e["args"]["bucket"], []).append(e)
        check(len(spans) == buckets, f"rank {r}: device spans of "
                                     f"{len(spans)} buckets, not {buckets}")
        total = 0
        for bucket, mine in spans.items():
            names = [e["name"] for e in mine]
            staged = "pack" in names
            steps = (["wait_gradients", "pack", "reduce", "unpack"] if staged
                     else ["wait_gradients", "reduce"])
            times = len(mine) // len(steps)
            check(times >= 1 and names == steps * times,
                  f"rank {r} bucket {bucket}: device spans {names}")
            for a, b in zip(mine, mine[1:len(steps)]):
                check(a["dur"] >= 0 and a["ts"] + a["dur"] <= b["ts"] + 2,
                      f"rank {r} bucket {bucket}: {a['name']} "
                      f"({a['ts']}+{a['dur']}) then {b['name']} ({b['ts']})")
            total += mine[steps.index("reduce")]["args"]["bytes"]
        check(total == sum(rows) * 256 * 4,
              f"rank {r}: reduce spans of {total} bytes, one iteration's "
              f"gradients hold {sum(rows) * 256 * 4}")
        # The summary finds the same iterations and buckets.
        device = timeline_summary.summarize(events)[r].device
        found = sum(b.bytes for b in device.buckets.values())
        check(device.iterations in (1, 2) and found == total and
              len(device.buckets) == len(spans) and
              0 <= device.gradients <= device.span and
              # Microseconds with fractions: the three differ by rounding.
              abs(device.tail - (device.span - device.gradients)) < 1e-3,
              f"rank {r}: the summary of its device track: {device}")


def device_hooks(comm, xp):
    """Bucket hooks on GPU buckets: the buffer is device memory on the
    bucket's stream; a hook reducing it through the bucket's collectives
    gives what the reducer gives without one, and gathers; a hook that
    misuses a GPU bucket raises BucketHookError on every rank; the
    built-in hooks compute with CuPy (refused without it)."""
    rng = np.random.default_rng(RANK + 7)
    rows = [3, 40, 200]
    values = [rng.integers(-8, 8, (r, 16)).astype(np.float32) for r in rows]
    everyone = world.allgather(values)
    means = [sum(e[k] for e in everyone) / np.float32(SIZE)
             for k in range(len(rows))]
    mine = xp.asarray(np.full(4, RANK, np.float32))
    gathered = xp.asarray(np.zeros((SIZE, 4), np.float32))
    xp.asnumpy(gathered)  # both written before the engine reads them
    seen = []

    def hook(bucket):
        seen.append((bucket.on_device, bucket.stream != 0,
                     type(bucket.buffer).__name__))
        if bucket.index == 0:
            bucket.all_gather(mine, out=gathered)
        bucket.all_reduce(bucket.buffer)

    def reduced(hook):
        grads = [xp.asarray(v) for v in values]
        reducer = comm.gradient_reducer(grads, 700, division=True,
                                        hook=hook)
        with reducer:
            for k in reversed(range(len(rows))):
                reducer.ready(k)
        return [xp.asnumpy(g) for g in grads]

    for k, g in enumerate(reduced(hook)):
        check(np.array_equal(g, means[k]), f"a GPU bucket's hook [{k}]")
    check(seen and all(s == (True, True, "DeviceBuffer") for s in seen),
          f"GPU buckets as the hook saw them: {seen}")
    check(np.array_equal(xp.asnumpy(gathered), np.repeat(
        np.arange(SIZE, dtype=np.float32), 4).reshape(SIZE, 4)),
        "a GPU bucket's all_gather")
    for bad, words in (
            (lambda b: np.zeros(b.buffer.size, np.float32),
             "returns None or it"),
            (lambda b: b.all_reduce(np.zeros(3, np.float32)),
             "arrays of its device"),
            (lambda b: b.all_reduce(b.buffer, wire_dtype="float16"),
             "in its own dtype"),
            (lambda b: b.all_gather(b.buffer), "needs out="),
            (nncomm.hooks.bf16_compress, "wire_dtype='bfloat16'")):
        raises(nncomm.BucketHookError, words, lambda: reduced(bad),
               f"a GPU bucket's hook: {words}")
    # ZeRO stage 2's reduction onto owners is a host hook.
    owners = nncomm._nncomm.OwnerReducing([0, 48, 688], [0, 688 * SIZE])
    raises(NotImplementedError, "shard='state'",
           lambda: comm.gradient_reducer([xp.asarray(v) for v in values],
                                         700, hook=owners),
           "shard='gradients' on GPU gradients")
    try:
        import cupy  # noqa: F401
    except ImportError:
        for builtin in (nncomm.hooks.fp16_compress,
                        nncomm.hooks.PowerSGD(start_iter=0)):
            raises(nncomm.BucketHookError, "computes with CuPy",
                   lambda: reduced(builtin), f"{builtin!r} without CuPy")
        return
    # Small integers: float16 sums and the division exact.
    for k, g in enumerate(reduced(nncomm.hooks.fp16_compress)):
        check(np.array_equal(g, means[k]), f"fp16_compress on a GPU [{k}]")
    powersgd = nncomm.hooks.PowerSGD(rank=2, start_iter=0)
    for _ in range(3):
        got = reduced(powersgd)
        check(all(np.isfinite(g).all() for g in got), "PowerSGD on a GPU")
    check(type(powersgd.state(0)[0][0]).__module__.startswith("cupy"),
          "PowerSGD's state on a GPU is CuPy's")
    # A checkpoint: pickled (its state copied to the host), it goes on on
    # the device as the one never stopped (within rounding: cuBLAS need
    # not be bitwise the same from one call to the next; a state lost is
    # far off).
    import pickle
    resumed = pickle.loads(pickle.dumps(powersgd))
    check(all(np.allclose(a, b, rtol=0, atol=1e-5 * np.abs(a).max())
              for a, b in zip(reduced(powersgd), reduced(resumed))),
          "PowerSGD on a GPU, resumed from a pickle")


def collectives(xp, new_arrays):
    """Every collective on the device arrays of `xp` (CuPy, or FakeCupy)
    against numpy, alltoall and all_gather of sizes that differ between
    ranks included; with `new_arrays`, also into arrays they make (which
    needs CuPy)."""
    rng = np.random.default_rng(RANK)
    mine = [rng.integers(-8, 8, n).astype(dt) for n, dt in
            [(5, np.float32), (300, np.float32), (7, np.float16),
             (300000, np.float32), (40, np.int32)]]
    everyone = world.allgather(mine)
    check(comm.transport == "mpi", "transport before any GPU call")
    for inplace in (False, True):
        arrays = [xp.asarray(x) for x in mine]
        comm.all_reduce(arrays, inplace=inplace)
        for k, x in enumerate(arrays):
            expected = sum(e[k] for e in everyone)
            check(np.array_equal(xp.asnumpy(x), expected),
                  f"all_reduce inplace={inplace} [{k}]")
    expected = os.environ.get("NNCOMM_GPU_TRANSPORT", "auto")
    check(expected == "auto" or comm.transport == expected,
          f"transport {comm.transport}, NNCOMM_GPU_TRANSPORT={expected}")
    floats = [k for k, x in enumerate(mine) if x.dtype.kind == "f"]
    for root in range(SIZE):
        arrays = [xp.asarray(mine[k]) for k in floats]
        comm.reduce(arrays, root, division=True)
        for k, x in zip(floats, arrays):
            mean = sum(e[k].astype(np.float64) for e in everyone) / SIZE
            got = xp.asnumpy(x)
            check(np.allclose(got, mean if RANK == root else mine[k],
                              rtol=1e-3), f"reduce root={root} [{k}]")
        arrays = [xp.asarray(x) for x in mine]
        comm.bcast(arrays, root)
        for k, x in enumerate(arrays):
            check(np.array_equal(xp.asnumpy(x), everyone[root][k]),
                  f"bcast root={root} [{k}]")
    send = xp.asarray(mine[1])
    recv = [xp.zeros_like(send) for _ in range(SIZE)]
    comm.all_gather(send, recv)
    for r in range(SIZE):
        check(np.array_equal(xp.asnumpy(recv[r]), everyone[r][1]),
              f"all_gather [{r}]")
    blocks = [xp.asarray(mine[1]) for _ in range(SIZE)]
    out = xp.zeros_like(blocks[0])
    comm.reduce_scatter(blocks, out)
    check(np.array_equal(xp.asnumpy(out), sum(e[1] for e in everyone)),
          "reduce_scatter")
    # async_op=True: the same on the group's queue, all started before any
    # is waited for, and waited for in reverse order.
    arrays = [xp.asarray(x) for x in mine]
    copied = xp.asarray(mine[0])
    recv = [xp.zeros_like(send) for _ in range(SIZE)]
    out = xp.zeros_like(blocks[0])
    pending = [comm.all_reduce(arrays, async_op=True),
               comm.bcast(copied, SIZE - 1, async_op=True),
               comm.all_gather(send, recv, async_op=True),
               comm.reduce_scatter(blocks, out, async_op=True)]
    for p in reversed(pending):
        p.wait()
    for k, x in enumerate(arrays):
        check(np.array_equal(xp.asnumpy(x), sum(e[k] for e in everyone)),
              f"all_reduce async_op [{k}]")
    check(np.array_equal(xp.asnumpy(copied), everyone[SIZE - 1][0]),
          "bcast async_op")
    for r in range(SIZE):
        check(np.array_equal(xp.asnumpy(recv[r]), everyone[r][1]),
              f"all_gather async_op [{r}]")
    check(np.array_equal(xp.asnumpy(out), sum(e[1] for e in everyone)),
          "reduce_scatter async_op")

    # Horovod's alltoall: rank q sends rank r q + r + 1 rows of 3, into a
    # new CuPy array and into a given one.
    counts = [RANK + r + 1 for r in range(SIZE)]
    rows = (np.arange(sum(counts) * 3, dtype=np.float32).reshape(-1, 3)
            + 1000 * RANK)
    sent = world.allgather(rows)
    expected = np.concatenate([
        sent[q][sum(q + r + 1 for r in range(RANK)):][:q + RANK + 1]
        for q in range(SIZE)])
    if new_arrays:
        got, received = comm.alltoall(xp.asarray(rows), splits=counts)
        check(isinstance(got, xp.ndarray) and got.dtype == np.float32,
              "alltoall makes a CuPy array")
        check(np.array_equal(xp.asnumpy(got), expected), "alltoall new array")
        check(received == [q + RANK + 1 for q in range(SIZE)],
              "alltoall received splits")
    given = xp.zeros(expected.size, np.float32)
    got, _ = comm.alltoall(xp.asarray(rows), given, counts)
    check(got is given and np.array_equal(xp.asnumpy(given).reshape(-1, 3),
                                          expected), "alltoall into recv")
    # Horovod's allgather: rank q has q + 1 rows of 2, gathered into a new
    # array, and into one array per rank.
    mine_rows = xp.full((RANK + 1, 2), RANK, np.int64)
    everything = np.concatenate([np.full((q + 1, 2), q, np.int64)
                                 for q in range(SIZE)])
    if new_arrays:
        got = comm.all_gather(mine_rows)
        check(np.array_equal(xp.asnumpy(got), everything),
              "all_gather into a new array")
    parts = [xp.zeros(2 * (q + 1), np.int64) for q in range(SIZE)]
    comm.all_gather(mine_rows, parts)
    for q in range(SIZE):
        check(np.array_equal(xp.asnumpy(parts[q]), np.full(2 * (q + 1), q)),
              f"all_gather into a list [{q}]")


def fake_cupy():
    """Arrays on this rank's device of the fake CUDA runtime (RANK % 2 of
    its two), which the emulated build runs on."""
    from fake_device import FakeCupy
    from nncomm import _nncomm
    return FakeCupy(_nncomm.__file__, RANK % 2, RANK + 1)


def print_raised(call):
    """Runs `call` and prints what it raised on this rank, and how soon
    (the test reads the lines)."""
    global checks
    start = time.monotonic()
    try:
        call()
    except Exception as e:  # noqa: BLE001 (each rank reports what it got)
        print(f"rank {RANK} raised after {time.monotonic() - start:.1f} s: "
              f"{type(e).__name__}: {e}", flush=True)
    checks += 1


comm = nncomm.Communicator(types.SimpleNamespace(backend=["cpu:float"]))
comm.init()

if MODE == "refused":
    a = np.ones(6, np.float32)
    raises(ValueError, "not contiguous",
           lambda: comm.all_reduce(HostDescribed(a, strides=(8,))),
           "strided")
    raises(ValueError, "read-only",
           lambda: comm.all_reduce(HostDescribed(a, readonly=True)),
           "read-only")
    raises(ValueError, "different CUDA streams",
           lambda: comm.all_reduce([HostDescribed(a[:3], stream=1),
                                    HostDescribed(a[3:], stream=7)]),
           "streams")
    raises(ValueError, "share memory",
           lambda: comm.all_reduce([HostDescribed(a), HostDescribed(a[2:])]),
           "overlap")
    raises(ValueError, "different CUDA streams",
           lambda: comm.all_gather(HostDescribed(a[:3], stream=1),
                                   [HostDescribed(np.zeros(3, np.float32),
                                                  stream=9)
                                    for _ in range(SIZE)]),
           "all_gather streams")
    raises(TypeError, "dtype uint8",
           lambda: comm.all_reduce(HostDescribed(np.ones(3, np.uint8))),
           "dtype")
    raises(TypeError, "not a GPU array",
           lambda: comm.all_reduce([HostDescribed(a), a]), "mixed")
    raises(TypeError, "floating",
           lambda: comm.all_reduce(HostDescribed(np.ones(3, np.int32)),
                                   division=True), "division of integers")
    raises(TypeError, "gradient_reducer",
           lambda: comm.all_reduce_callback([HostDescribed(a)], 64),
           "the callback takes NdArrays only")
    raises(TypeError, "float32, float16 or float64",
           lambda: comm.gradient_reducer(
               [HostDescribed(np.ones(3, np.int32))], 64),
           "integer gradients")
    # The CUDA packer converts among float32, float16 and bfloat16 only.
    raises(TypeError, "data[1] is float64 and the wire dtype float32",
           lambda: comm.gradient_reducer(
               [HostDescribed(a), HostDescribed(np.ones(3))], 64),
           "float64 gradients converted on a device")
    raises(TypeError, "data[0] is float32 and the wire dtype float64",
           lambda: comm.gradient_reducer([HostDescribed(a)], 64,
                                         wire_dtype="float64"),
           "float32 gradients sent as float64 from a device")
    rows = HostDescribed(np.ones((SIZE * (RANK + 1), 2), np.float32))
    raises(ValueError, "different CUDA streams",
           lambda: comm.alltoall(rows, HostDescribed(
               np.zeros((SIZE + SIZE * (SIZE - 1) // 2) * 2, np.float32),
               stream=9)), "alltoall streams")
    raises(TypeError, "GPU array",
           lambda: comm.alltoall(rows, np.zeros(4, np.float32)),
           "alltoall of GPU arrays into host memory")
    try:
        import cupy  # noqa: F401
    except ImportError:
        # Every rank learns why no receiving array can be made here.
        raises(TypeError, "CuPy", lambda: comm.alltoall(rows),
               "alltoall into a new array without CuPy")
        raises(TypeError, "CuPy", lambda: comm.all_gather(rows),
               "all_gather into a new array without CuPy")
    # A valid call: every rank learns why the GPU path cannot run here.
    received = (SIZE + SIZE * (SIZE - 1) // 2) * 2
    for call in (lambda: comm.all_reduce(HostDescribed(a)),
                 lambda: comm.bcast(HostDescribed(a), 0),
                 lambda: comm.gradient_reducer([HostDescribed(a)], 64),
                 lambda: comm.alltoall(rows, HostDescribed(
                     np.zeros(received, np.float32))),
                 lambda: comm.all_gather(rows, [
                     HostDescribed(np.zeros(2 * SIZE * (q + 1), np.float32))
                     for q in range(SIZE)])):
        raises(RuntimeError, "CUDA", call, "no GPU path here")
elif MODE == "cupy":
    import cupy as cp

    collectives(cp, new_arrays=True)
    cp.cuda.get_current_stream().synchronize()

    def backward(weights, x, grads, order):
        """A chain of matrix products writing each gradient in turn on the
        current stream, as a backward would; yields each index once its
        gradient's work is enqueued."""
        h = x
        for k in order:
            h = cp.tanh(h @ weights[k])
            grads[k][...] = h[:grads[k].shape[0]] @ weights[k].T
            yield k

    # The engine on GPU gradients equals a plain all_reduce, bitwise: the
    # same values summed over the same transport. Gradients of 1 to 2048
    # rows (a 2048 x 256 float32 one is reduced in place), a float16 one
    # under keep_dtype, on the legacy default stream and on a stream of
    # CuPy's own, made ready in backward's order.
    generator = cp.random.RandomState(RANK + 1)
    rows = [1, 64, 200, 2048, 256, 33]
    for stream, keep_dtype in [(cp.cuda.Stream.null, False),
                               (cp.cuda.Stream(non_blocking=True), True)]:
        with stream:
            weights = [generator.standard_normal((256, 256), cp.float32) / 16
                       for _ in rows]
            dtypes = [cp.float16 if keep_dtype and k == 1 else cp.float32
                      for k in range(len(rows))]
            grads = [cp.zeros((r, 256), dt) for r, dt in zip(rows, dtypes)]
            reducer = comm.gradient_reducer(grads, 5000, division=True,
                                            keep_dtype=keep_dtype)
            order = list(reversed(range(len(rows))))
            for it in range(3):
                x = generator.standard_normal((2048, 256), cp.float32)
                reducer.begin()
                for k in backward(weights, x, grads, order):
                    reducer.ready(k)
                reducer.finish()
                got = [cp.asnumpy(g) for g in grads]
                reference = [cp.zeros_like(g) for g in grads]
                for _ in backward(weights, x, reference, order):
                    pass
                comm.all_reduce(reference, division=True)
                for k, (g, r) in enumerate(zip(got, reference)):
                    check(np.array_equal(g, cp.asnumpy(r)),
                          f"gradient_reducer stream={stream.ptr} "
                          f"iteration {it} [{k}]")
            stream.synchronize()
    device_hooks(comm, cp)
    device_timeline(comm, cp, lambda a, v: a.__setitem__(Ellipsis,
                                                         cp.asarray(v)))

elif MODE == "one_rank_refused":
    # Only rank 0 passes an array on the other fake device: it raises, and
    # the others learn that it will not make the call instead of waiting.
    xp = fake_cupy()
    x = xp.asarray(np.ones(3, np.float32))
    comm.all_reduce(x)
    bad = xp.asarray(np.ones(3, np.float32), device=1 - RANK % 2) \
        if RANK == 0 else x
    print_raised(lambda: comm.all_reduce(bad))
elif MODE == "one_rank_ended":
    # Rank 1's script ends after one all_reduce of rank 0's two: rank 0's
    # wait, which its transport (NCCL) can tell nothing about, fails from
    # the end notices.
    xp = fake_cupy()
    x = xp.asarray(np.ones(3, np.float32))
    comm.all_reduce(x)
    if RANK == 1:
        sys.exit(0)
    print_raised(lambda: comm.all_reduce(x))
else:  # MODE == "emulated"
    xp = fake_cupy()
    collectives(xp, new_arrays=False)
    check(comm.transport == os.environ.get("NNCOMM_GPU_TRANSPORT", "mpi"),
          f"transport {comm.transport}")

    # Arrays of no elements (address 0, as CuPy gives them) first in a
    # list: passed over, the others reduced.
    arrays = [xp.zeros(0, np.float32), xp.asarray(np.ones(3, np.float32))]
    comm.all_reduce(arrays, division=True)
    check(np.array_equal(xp.asnumpy(arrays[1]), np.ones(3, np.float32)),
          "all_reduce with an empty array first")

    # The engine on device gradients equals a plain all_reduce, bitwise:
    # each gradient written by work enqueued on the legacy stream (which
    # the fake runs late) and made ready at once, in backward's order;
    # 2048 x 256 goes in place, and under keep_dtype one is float16.
    rng = np.random.default_rng(RANK + 7)
    rows = [1, 64, 200, 2048, 256, 33]
    for keep_dtype in (False, True):
        dtypes = [np.float16 if keep_dtype and k == 1 else np.float32
                  for k in range(len(rows))]
        grads = [xp.zeros((r, 256), dt) for r, dt in zip(rows, dtypes)]
        reducer = comm.gradient_reducer(grads, 5000, division=True,
                                        keep_dtype=keep_dtype)
        for it in range(3):
            values = [rng.standard_normal(g.shape).astype(g.dtype)
                      for g in grads]
            reducer.begin()
            for k in reversed(range(len(rows))):
                xp.write(grads[k], values[k])
                reducer.ready(k)
            reducer.finish()
            reference = [xp.asarray(v) for v in values]
            comm.all_reduce(reference, division=True)
            for k, (g, r) in enumerate(zip(grads, reference)):
                check(np.array_equal(xp.asnumpy(g), xp.asnumpy(r)),
                      f"gradient_reducer keep_dtype={keep_dtype} "
                      f"iteration {it} [{k}]")

    # float16 on the wire: converted while packed, summed, divided while
    # unpacked (small integers: every step exact).
    small = [rng.integers(-8, 8, (r, 16)).astype(np.float32) for r in rows]
    everyone = world.allgather(small)
    grads = [xp.asarray(v) for v in small]
    reducer = comm.gradient_reducer(grads, 700, division=True,
                                    wire_dtype="float16")
    with reducer:
        for k in reversed(range(len(rows))):
            reducer.ready(k)
    for k, g in enumerate(grads):
        mean = sum(e[k] for e in everyone) / np.float32(SIZE)
        check(np.array_equal(xp.asnumpy(g), mean), f"float16 wire [{k}]")
    device_hooks(comm, xp)
    device_timeline(comm, xp, xp.write)

    # float64, which the CUDA packer does not move: the transport scales
    # and divides it, fused (300) or in place (140000: over 1 MiB). Sums of
    # quarters are exact in any order, so only the division rounds.
    wide = [rng.integers(-1000, 1000, n) / 4 for n in (300, 140000)]
    everyone = world.allgather(wide)
    arrays = [xp.asarray(v) for v in wide]
    comm.all_reduce(arrays, division=True)
    for k, x in enumerate(arrays):
        mean = sum(e[k] for e in everyone) / SIZE
        check(np.array_equal(xp.asnumpy(x), mean),
              f"float64 all_reduce [{k}]")
    grads = [xp.asarray(v) for v in wide]
    reducer = comm.gradient_reducer(grads, 700, division=True,
                                    scale_grad=0.5, keep_dtype=True)
    with reducer:
        for k in (1, 0):
            reducer.ready(k)
    for k, g in enumerate(grads):
        mean = sum(e[k] * 0.5 for e in everyone) / SIZE
        check(np.array_equal(xp.asnumpy(g), mean),
              f"float64 gradient_reducer [{k}]")

    # An array on the other fake device than the group's raises before
    # anything is enqueued, on every rank; the group goes on afterwards.
    other = xp.asarray(np.ones(3, np.float32), device=1 - RANK % 2)
    raises(ValueError, f"is on CUDA device {1 - RANK % 2}",
           lambda: comm.all_reduce([xp.asarray(np.ones(3, np.float32)),
                                    other]), "an array on another device")
    raises(ValueError, f"is on CUDA device {1 - RANK % 2}",
           lambda: comm.gradient_reducer([other], 64),
           "gradients on another device")
    # Only rank 0's are elsewhere: it says where, every other rank that a
    # rank's gradients are on another GPU, and no rank waits.
    if SIZE > 1:
        mixed = other if RANK == 0 else xp.asarray(np.ones(3, np.float32))
        raises(ValueError, f"is on CUDA device {1 - RANK % 2}" if RANK == 0
               else "a rank's are on another GPU than its group's",
               lambda: comm.gradient_reducer([mixed], 64),
               "one rank's gradients on another device")
    x = xp.asarray(np.ones(3, np.float32))
    comm.all_reduce(x)
    check(np.array_equal(xp.asnumpy(x), np.full(3, SIZE, np.float32)),
          "all_reduce after a refusal")

    # A group whose ranks all use fake device 0 of the host's two is told
    # to spread, once, by its lowest rank (one rank alone needs only one);
    # NCCL, asked for, refuses it on every rank.
    comm.new_group(("device 0", list(range(SIZE))))
    x = xp.asarray(np.ones(3, np.float32), device=0)
    if comm.transport == "nccl" and SIZE > 1:
        raises(ValueError, "share a GPU, which NCCL refuses",
               lambda: comm.all_reduce(x, group="device 0"),
               "NCCL on a shared device")
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            comm.all_reduce(x, group="device 0")
        said = [str(w.message) for w in caught
                if "ctx.device_id = str(comm.local_rank)" in str(w.message)]
        check(said == ([] if SIZE == 1 or RANK > 0 else [
            f"group ranks {list(range(SIZE))} on this host use 1 of its 2 "
            f"GPUs, so ranks sharing one cannot use NCCL (they communicate "
            f"through CUDA IPC or host memory); give each rank its own, as "
            f"nnabla's examples do with "
            f"ctx.device_id = str(comm.local_rank)"]), f"sharing advice {said}")
        check(np.array_equal(xp.asnumpy(x), np.full(3, SIZE, np.float32)),
              "all_reduce on the shared device")

failed = world.allreduce(len(failures))
if failed:
    print("\n".join(failures), file=sys.stderr, flush=True)
    world.Abort(1)
if RANK == 0:
    print(f"gpu_arrays: {checks} checks passed on {SIZE} ranks", flush=True)
